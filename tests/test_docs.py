"""The product's documents live in ``docs/`` and every citation of them resolves (no Spark needed).

* Every ``docs/<file>.md`` mentioned in a ``*.py``, ``*.toml``, ``*.sh`` or ``*.md`` file of the repository names
  an existing file, and every section it cites (``§1.2``, ``§1-2``, ``§2, §8``) is a numbered heading of that file
  (``## 2. …`` or ``### 1.2 …``). A range ``§4-7`` needs each of §4, §5, §6, §7.
* Links and pictures of ``README.md`` and ``docs/*.md`` (``[…](contracts.md#12-send-failures-landingsend_failures)``,
  ``![…](docs/status-page.png)``) name an existing file and, when they carry one, an anchor that a heading of it
  produces (GitHub's anchor rule).
* Each line of the README's current figures (the table under ``## Current figures``) names the command that
  measures it and the commit it was measured at.
* No file of the repository points back to the source material the documents were written from.
* The decision plane and the simulator state their rules, not the issues and sweep cases behind them.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CITING_SUFFIXES = (".py", ".toml", ".sh", ".md")
#: Folders never scanned when git cannot list the repository's files.
SKIP_DIRS = {".git", ".venv", "build", "dist", "scratch", "lake", "landing", "__pycache__", "spark-warehouse"}
#: Names of the source material outside the repository, spelled so that this file does not contain them.
FORBIDDEN = tuple(part[0] + part[1] for part in (("../", "shared"), ("CONTRACTS", ".md"), ("FORMATS", ".md"),
                                                  ("DIGEST", ".md")))

#: ``docs/<file>.md`` (not inside a URL or a longer path), optional closing quotes or backticks, then section
#: citations: ``§1``, ``§1.2``, ``§1-2``, ``§ 2``, several separated by commas (``§2, §8``).
SECTION = r"§\s*\d+(?:\.\d+)*(?:\s*[-–]\s*\d+(?:\.\d+)*)?"
REFERENCE = re.compile(
    r"(?<![\w/.-])docs/(?P<file>[\w-]+\.md)[`'\"]*(?P<sections>(?:\s*,?\s*" + SECTION + r")*)"
)
ONE_SECTION = re.compile(r"§\s*(?P<first>\d+(?:\.\d+)*)(?:\s*[-–]\s*(?P<last>\d+(?:\.\d+)*))?")
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.+?)\s*#*\s*$")
HEADING_NUMBER = re.compile(r"^(?P<number>\d+(?:\.\d+)*)\.?\s")
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
#: The README's section of current figures, and what each of its lines must name.
FIGURES_HEADING = "Current figures"
COMMAND = re.compile(r"`[^`]+`")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


@dataclass(frozen=True)
class Reference:
    where: str  # "path:line"
    file: str  # e.g. "contracts.md"
    sections: tuple[str, ...]  # section numbers cited, ranges expanded


def repository_files() -> list[Path]:
    """Files of the repository: tracked plus new, not ignored ones (git), else a walk that skips build output."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout
        paths = [ROOT / name for name in out.decode("utf-8").split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*") if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)]
    return sorted(p for p in paths if p.is_file())


def expand(first: str, last: str | None) -> tuple[str, ...]:
    """``1``/``None`` → (1,); ``4``/``7`` → (4, 5, 6, 7); ``1.1``/``1.2`` → both ends only."""
    if last is None:
        return (first,)
    if first.isdigit() and last.isdigit() and int(first) <= int(last):
        return tuple(str(n) for n in range(int(first), int(last) + 1))
    return (first, last)


def references_in(text: str, where: str) -> list[Reference]:
    """Every ``docs/<file>.md [§…]`` citation in ``text``; ``where`` is the file name for messages."""
    refs = []
    for match in REFERENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        sections: list[str] = []
        for sec in ONE_SECTION.finditer(match["sections"]):
            sections.extend(expand(sec["first"], sec["last"]))
        refs.append(Reference(f"{where}:{line}", match["file"], tuple(sections)))
    return refs


def headings(markdown: str) -> list[str]:
    """Titles of the Markdown headings outside fenced code blocks."""
    titles, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            titles.append(match["title"])
    return titles


def section_numbers(markdown: str) -> set[str]:
    """``## 2. Outputs`` → "2", ``### 1.2 Send failures`` → "1.2"."""
    return {m["number"] for title in headings(markdown) if (m := HEADING_NUMBER.match(title))}


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (``_`` and ``-`` kept), spaces → ``-``."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def problems_of(refs: list[Reference], docs_dir: Path) -> list[str]:
    """What is wrong with ``refs`` against the documents in ``docs_dir`` (empty when every citation resolves)."""
    problems = []
    for ref in refs:
        doc = docs_dir / ref.file
        if not doc.is_file():
            problems.append(f"{ref.where}: docs/{ref.file} does not exist")
            continue
        known = section_numbers(doc.read_text(encoding="utf-8"))
        for number in ref.sections:
            if number not in known:
                problems.append(f"{ref.where}: docs/{ref.file} has no section §{number} (it has {sorted(known)})")
    return problems


def link_problems(doc: Path) -> list[str]:
    """Relative links of a document that name a missing file or an anchor no heading produces."""
    problems = []
    text = doc.read_text(encoding="utf-8")
    for match in LINK.finditer(text):
        target = match["target"]
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = (doc.parent / path) if path else doc
        line = text.count("\n", 0, match.start()) + 1
        if not linked.exists():
            problems.append(f"{doc.name}:{line}: link to missing file {path}")
        elif fragment and linked.suffix == ".md":
            anchors = {anchor(t) for t in headings(linked.read_text(encoding="utf-8"))}
            if fragment not in anchors:
                problems.append(f"{doc.name}:{line}: {linked.name} has no heading with anchor #{fragment}")
    return problems


def figure_problems(readme: str) -> list[str]:
    """Lines of the README's current-figures table that do not name their command (in backticks, in the
    ``command`` column) and the commit they were measured at (7 to 40 hex digits, in the ``commit`` column)."""
    lines = readme.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if HEADING.match(line) and
                     HEADING.match(line)["title"] == FIGURES_HEADING)
    except StopIteration:
        return [f"README.md: no '## {FIGURES_HEADING}' section"]
    problems, header, rows = [], None, 0
    for number, line in enumerate(lines[start + 1:], start=start + 2):
        if HEADING.match(line):
            break
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = [cell.lower() for cell in cells]
            missing = {"figure", "command", "commit"} - set(header)
            if missing:
                return [f"README.md:{number}: the figures table has no column {sorted(missing)}"]
            continue
        if set(line) <= set("|-: "):
            continue
        rows += 1
        row = dict(zip(header, cells))
        if not COMMAND.search(row.get("command", "")):
            problems.append(f"README.md:{number}: figure without its command: {row.get('figure', line)[:60]}")
        if not COMMIT.search(row.get("commit", "")):
            problems.append(f"README.md:{number}: figure without its commit: {row.get('figure', line)[:60]}")
    if not rows:
        problems.append(f"README.md: the '{FIGURES_HEADING}' section has no figure lines")
    return problems


def all_references() -> list[Reference]:
    """References in the repository's citing files; this file's own examples (below) are not citations."""
    refs = []
    for path in repository_files():
        if path.suffix in CITING_SUFFIXES and path != Path(__file__).resolve():
            refs.extend(references_in(path.read_text(encoding="utf-8", errors="replace"), str(path.relative_to(ROOT))))
    return refs


# --- the repository ------------------------------------------------------------------------------------------------


def test_the_three_documents_and_their_index_exist():
    for name in ("contracts.md", "rocketmq-formats.md", "background.md", "README.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for doc in sorted(DOCS.glob("*.md")):
        if doc.name != "README.md":
            assert f"({doc.name})" in index, f"docs/README.md does not list {doc.name}"


def test_contracts_and_formats_keep_the_cited_section_numbers():
    assert {"1", "1.1", "1.2", "2", "3", "4"} <= section_numbers((DOCS / "contracts.md").read_text(encoding="utf-8"))
    formats = section_numbers((DOCS / "rocketmq-formats.md").read_text(encoding="utf-8"))
    assert {str(n) for n in range(1, 9)} <= formats


def test_every_docs_reference_names_an_existing_file_and_section():
    refs = all_references()
    # the code cites the documents in dozens of places; far fewer means the scan itself is broken
    assert len(refs) >= 40, f"only {len(refs)} references found"
    assert sum(1 for r in refs if r.sections) >= 40
    problems = problems_of(refs, DOCS)
    assert not problems, "broken docs references:\n" + "\n".join(problems)


def test_links_and_pictures_of_the_readme_and_the_documents_resolve():
    documents = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    problems = [p for doc in documents for p in link_problems(doc)]
    assert not problems, "broken links or pictures:\n" + "\n".join(problems)
    # the scan itself works: the README links its documents and shows its picture
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(LINK.findall(readme)) >= 10 and "](docs/status-page.png)" in readme


def test_every_readme_figure_names_its_command_and_commit():
    problems = figure_problems((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not problems, "README figures:\n" + "\n".join(problems)


def test_no_file_points_at_the_source_material_outside_the_repository():
    offenders = []
    for path in repository_files():
        data = path.read_bytes()
        for name in FORBIDDEN:
            if name.encode("utf-8") in data:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, "files citing material outside the repository:\n" + "\n".join(offenders)


# --- the checker itself --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("see docs/contracts.md §1.2.", [("contracts.md", ("1.2",))]),
        ("(docs/rocketmq-formats.md §2-7)", [("rocketmq-formats.md", ("2", "3", "4", "5", "6", "7"))]),
        ("``docs/rocketmq-formats.md`` §1-2, §8)", [("rocketmq-formats.md", ("1", "2", "8"))]),
        ("docs/rocketmq-formats.md §2, StatsItem", [("rocketmq-formats.md", ("2",))]),
        ("docs/contracts.md §3. The", [("contracts.md", ("3",))]),
        ("article 001 (``docs/background.md``)", [("background.md", ())]),
        ("http://rocketmq.apache.org/docs/faq.md §2", []),
        ("a/docs/contracts.md §2", []),
    ],
)
def test_references_are_read_in_every_form_the_code_uses(text, expected):
    assert [(r.file, r.sections) for r in references_in(text, "x")] == expected


def test_a_missing_section_or_file_is_reported(tmp_path):
    (tmp_path / "contracts.md").write_text("# c\n\n## 1. Inputs\n\n### 1.1 Stats\n\n```\n## 9. in a fence\n```\n")
    refs = references_in("docs/contracts.md §1.1 docs/contracts.md §1-2 docs/contracts.md §9 docs/nope.md", "f.py")
    assert problems_of(refs, tmp_path) == [
        "f.py:1: docs/contracts.md has no section §2 (it has ['1', '1.1'])",
        "f.py:1: docs/contracts.md has no section §9 (it has ['1', '1.1'])",
        "f.py:1: docs/nope.md does not exist",
    ]


def test_a_link_to_a_missing_anchor_is_reported(tmp_path):
    (tmp_path / "a.md").write_text("## 1.2 Send failures: `<landing>/send_failures/`\n")
    (tmp_path / "b.md").write_text("[ok](a.md#12-send-failures-landingsend_failures) [bad](a.md#12-send) [f](c.md)\n")
    assert link_problems(tmp_path / "b.md") == [
        "b.md:1: a.md has no heading with anchor #12-send",
        "b.md:1: link to missing file c.md",
    ]


def test_a_missing_picture_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.png").write_bytes(b"")
    (tmp_path / "README.md").write_text("![a](docs/there.png) ![b](docs/gone.png) [c](docs/x.md#y)\n")
    assert link_problems(tmp_path / "README.md") == [
        "README.md:1: link to missing file docs/gone.png",
        "README.md:1: link to missing file docs/x.md",
    ]


def test_a_figure_without_its_command_or_commit_is_reported():
    readme = "\n".join([
        "# r", "", "## Current figures", "",
        "| figure | command | commit |", "|---|---|---|",
        "| fine: 1 s | `./run.sh` | 27837c4 |",
        "| no command: 2 s | run it | 27837c4 |",
        "| no commit: 3 s | `bench/x.py` | yesterday |",
        "", "## Documents", "| figure | command | commit |", "| after the section | none | none |",
    ])
    assert figure_problems(readme) == [
        "README.md:8: figure without its command: no command: 2 s",
        "README.md:9: figure without its commit: no commit: 3 s",
    ]
    assert figure_problems("# r\n") == ["README.md: no '## Current figures' section"]


#: Packages whose docstrings and comments state rules, not the history behind them: the issue or sweep case that led to
#: a rule belongs in docs/decisions.md (§7 for the simulator, §8 for the decision plane) or the commit message.
RULES_NOT_HISTORY = ("pipelines/decide", "pipelines/sim")
HISTORY = re.compile(r"(?<![-\w])(?:issue|cases?) \d+", re.IGNORECASE)  # not a ``--cases 200`` flag


def history_mentions(folder: Path, root: Path = ROOT) -> list[str]:
    """``"<file>:<line>"`` (relative to ``root``) of every mention of an issue or a sweep case by number under
    ``folder``."""
    return [f"{p.relative_to(root)}:{n}" for p in sorted(folder.rglob("*.py"))
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1) if HISTORY.search(line)]


@pytest.mark.parametrize("folder", RULES_NOT_HISTORY)
def test_the_decision_plane_and_the_simulator_state_their_rules_not_their_history(folder):
    assert history_mentions(ROOT / folder) == []


def test_a_mention_of_a_sweep_case_is_found(tmp_path):
    (tmp_path / "m.py").write_text('"""The rule (sweep case 12: it failed)."""\n', encoding="utf-8")
    (tmp_path / "n.py").write_text('"""In case of a late broker: wait (``--cases 200``)."""\n', encoding="utf-8")
    assert history_mentions(tmp_path, tmp_path) == ["m.py:1"]
