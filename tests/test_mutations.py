"""The mutations of docs/mutations.md still fit the code (no Spark needed, a second or two): when code moves under a
patch, this fails here rather than months later in ``mutations/run.py``."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "mutations"
ENTRIES = tomllib.loads((HERE / "mutations.toml").read_text(encoding="utf-8"))["mutation"]
NAMES = [entry["name"] for entry in ENTRIES]


def test_every_patch_is_in_the_catalogue_once_and_every_entry_has_its_patch():
    assert len(set(NAMES)) == len(NAMES)
    assert sorted(p.stem for p in HERE.glob("*.patch")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_patch_applies_to_the_current_tree(name):
    # --check: nothing is written; the working tree is what the patch is checked against
    done = subprocess.run(["git", "apply", "--check", str(HERE / f"{name}.patch")], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"{name}.patch no longer applies (rewrite it for today's code): {done.stderr}"


@pytest.mark.parametrize("name", NAMES)
def test_patch_changes_product_code_only(name):
    touched = re.findall(r"^\+\+\+ b/(\S+)", (HERE / f"{name}.patch").read_text(encoding="utf-8"), re.MULTILINE)
    assert touched and all(path.split("/")[0] in ("pipelines", "control", "udfs") for path in touched), touched


@pytest.mark.parametrize("entry", ENTRIES, ids=NAMES)
def test_every_test_of_a_mutation_exists(entry):
    for test in entry["tests"]:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), test
        if name:
            source = (ROOT / path).read_text(encoding="utf-8")
            assert re.search(rf"^def {re.escape(name)}\(", source, re.MULTILINE), test


def test_the_document_lists_every_patch_once():
    document = (ROOT / "docs" / "mutations.md").read_text(encoding="utf-8")
    listed = re.findall(r"\(\.\./mutations/([\w-]+)\.patch\)", document)
    assert sorted(listed) == sorted(NAMES)


POLICY = HERE / "policy"
POLICY_NAMES = [entry["name"] for entry in
                tomllib.loads((HERE / "policy.toml").read_text(encoding="utf-8"))["mutation"]]


def test_every_policy_patch_is_in_its_catalogue_once():
    assert len(set(POLICY_NAMES)) == len(POLICY_NAMES)
    assert sorted(p.stem for p in POLICY.glob("*.patch")) == sorted(POLICY_NAMES)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_policy_patch_applies_to_the_current_tree(name):
    """mutations/policy.py (issue 49's power of the sweep) reports a patch that no longer applies as an error, after
    its baseline sweep: found here in a second (p01 stopped applying when ``LimitPolicy.view_hides_demand`` moved its
    context)."""
    done = subprocess.run(["git", "apply", "--check", str(POLICY / f"{name}.patch")], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"{name}.patch no longer applies (rewrite it for today's code): {done.stderr}"
