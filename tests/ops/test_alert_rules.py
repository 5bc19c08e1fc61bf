"""The shipped alert rules (conf/prometheus/rate-governor.rules.yml) with Prometheus's own tool: ``promtool check
rules`` and ``check config`` (the example scrape configuration), and ``promtool test rules`` on the unit tests of
tests/ops/alert_rules_test.yml. Skipped, saying so, only where promtool is not installed (Debian's ``prometheus``
package has it; .ci/run installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "conf" / "prometheus" / "rate-governor.rules.yml"
CONFIG = ROOT / "conf" / "prometheus" / "prometheus.yml"
UNIT_TESTS = Path(__file__).with_name("alert_rules_test.yml")
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package 'prometheus'; "
                                                             ".ci/run installs it): the alert rules were not checked")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_rules_and_example_config_pass_promtool_check():
    for args in (("check", "rules", "--lint=all", str(RULES)), ("check", "config", str(CONFIG))):
        done = promtool(*args)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 11 rules found" in promtool("check", "rules", str(RULES)).stdout


@needs_promtool
def test_rules_pass_their_unit_tests():
    done = promtool("test", "rules", str(UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_waits_has_a_severity_a_summary_and_a_firing_unit_test():
    text = RULES.read_text(encoding="utf-8")
    blocks = re.split(r"\n\s+- alert: ", text)[1:]
    names = [block.split("\n", 1)[0].strip() for block in blocks]
    assert len(names) == 11, names
    for name, block in zip(names, blocks):
        assert re.search(r"\n\s+for: \d+m\n", block), f"{name} has no `for`"
        assert re.search(r"\n\s+severity: (page|warning|info)\n", block), f"{name} has no severity"
        assert re.search(r"\n\s+summary: \".*\{\{", block), f"{name}'s summary names nothing of the alert"
    tests = UNIT_TESTS.read_text(encoding="utf-8")
    firing = re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", tests)
    assert set(firing) == set(names)
