"""bench/first_limit_frontier.py: a failing sweep case run with its first limits forced to constants, against the
shipped policy in the same session. Case 63 (a surge on a carrier of 1.1-1.4x headroom, one of whose carriers
restarts and forgets the limit) is past every constant: its bystanders lose the same 1.67 % at 100, 121 and 150
msg/s as under the shipped policy. Case 5 (a storm whose governor was stopped, read back from the lake) is a
sizing flaw: its first limit of 28.2 msg/s, bounded by the room its busy carrier leaves, keeps broker-a busy until
the squeeze and its bystanders lose 1.74 %, while a constant 20 msg/s passes every check (0.06 %). When 5's is
fixed the second test needs another case the policy fails (case 53 was the example until a probe beside a busy
carrier stopped)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import first_limit_frontier as frontier  # noqa: E402

BYSTANDERS = "bystander rejected sends per storm minute after containment"
LIFT = "each lift <= 8 event minutes after its fix"


def _lines(out: str) -> dict[str, str]:
    """The report's run lines by label (``shipped`` or ``<value> msg/s``)."""
    return {line.split(":")[0].strip(): line for line in out.splitlines() if ": bystanders " in line}


def test_a_case_past_every_constant_first_limit_is_reported_as_such(capsys):
    """Case 63: the shipped policy and every constant fail the bystanders' check alike: exit 0, no constant named."""
    code = frontier.main(["--case", "63", "--limits", "100,150"])
    out = capsys.readouterr().out
    runs = _lines(out)
    assert code == 0 and "no forced first limit passes every check" in out
    for run in ("shipped", "100 msg/s", "150 msg/s"):
        assert runs[run].split("failed:")[1].strip().startswith(BYSTANDERS), runs[run]


def test_a_constant_that_passes_a_case_the_policy_fails_is_reported_as_a_sizing_flaw(capsys):
    code = frontier.main(["--case", "5", "--kind", "storm", "--limits", "20"])
    out = capsys.readouterr().out
    assert code == 1 and "a constant beats the policy: 20 msg/s pass every check" in out
    assert BYSTANDERS in _lines(out)["shipped"] and _lines(out)["20 msg/s"].endswith("failed: none")


def test_bad_flags_print_one_line_and_exit_2(capsys):
    assert frontier.main(["--case", "115", "--limits", "0,10"]) == 2
    assert frontier.main(["--case", "115", "--limits", "10", "--shares", "broker-a=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench/first_limit_frontier.py: --limits '0,10': want values > 0",
                   "bench/first_limit_frontier.py: --shares 'broker-a=0.5': want positive fractions adding up to 1"]
