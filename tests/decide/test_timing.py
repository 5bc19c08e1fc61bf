"""When a limit's decisions take effect and what they may be decided on (docs/decisions.md §4 "When a decision takes
effect", "At the cap without evidence", "Lift"): each window judged against the limit the brokers had in it, a
probe's stated cost kept, a lift never published over a later window that shows the cause. One fold per test on
small inline windows; each names the closed loop that found the rule (the sweep's cases, the named scenarios)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from pipelines.config import DetectionConfig, LimitsConfig
from pipelines.decide.catalogue import policy_for
from pipelines.decide.paths.walk import fold_resource
from pipelines.decide.records.resource import Candidate, Decision, Observation, ResourceState, limit_in_force
from pipelines.decide.records.limit_rows import finish
from pipelines.decide.records.resource import Batch
from pipelines.decide.limits.steps import Params, decided_at
from pipelines.decide.words import Action, Status
from tests.helpers import ts

T0 = ts("2022-02-08 07:00:00")
P = Params.of(LimitsConfig(), DetectionConfig(), 60)
STORM = policy_for("group", P)


def end(i: int, seconds: int = 0) -> dt.datetime:
    return T0 + dt.timedelta(minutes=i, seconds=seconds)


def limited(**kw) -> ResourceState:
    """A storm limited to 40 msg/s (10 % of its 400 msg/s consume rate) on brokers a (60 %) and b (40 %) since
    window 1, at its cap with nothing logged (a client without the fallback send)."""
    base = dict(limit_qps=40.0, target_qps=40.0, limited_since=end(1), last_change_end=end(1),
                last_decision_end=end(1), last_candidate_end=end(1), baseline_tps=400.0,
                broker_shares={"a": 0.6, "b": 0.4}, mode="enforce")
    return ResourceState("group", "g", **{**base, **kw})


def window(i: int, admitted: float, *, reported=None, complete=True, per_broker=None) -> Observation:
    """The group's window ``i``: ``admitted`` msg/s of retries (send-backs only), 400 msg/s consumed; before its
    census (``complete`` False) only the brokers ``reported`` have landed their line."""
    shares = per_broker or {"a": 0.6 * admitted, "b": 0.4 * admitted}
    return Observation(end(i), admitted, 0, True, 400.0, sendback_tps=admitted, complete=complete,
                       broker_tps=shares, reported=None if complete else frozenset(reported or ()))


def test_a_restart_backlog_is_judged_under_the_limit_it_ran_under_not_a_probe_decided_on_it():
    """Named scenario storm_governor_killed (the Spark run of issue 66, run 4): killed 4 minutes into a persisting
    storm, restarted 3 minutes later, one micro-batch decided a probe on the backlog's first window and a lift on its
    fourth, read as if under the raise the brokers never had (601.7 msg/s admitted for a minute). A decision is taken
    at its processing time, at most ``max_decision_lag`` after the newest window the micro-batch saw: the backlog's
    windows all ran before it, at 40 msg/s, and keep the limit at the cap."""
    backlog = [window(i, 40.0) for i in range(2, 8)]
    now = end(9, 30)  # the restarted governor's first micro-batch, 2.5 minutes after the backlog's newest window
    decisions, state, evidence = fold_resource(limited(), [], end(7), P, observations=backlog, now=now)
    changes = [d.action for d in decisions if not d.reason.startswith("refresh")]
    assert changes == ["relax"] and state.probe_from_qps == 40.0
    assert state.probe_effective_end == end(11)  # the first window wholly after the decision's publication
    assert all(e.status == Status.CAPPED and e.limit_qps in (40.0, 60.0) for e in evidence)
    assert not any(d.action == "lift" for d in decisions)
    # a replay of days-old windows still takes effect in the stream's time, whatever run decided it
    assert decided_at(end(7) + dt.timedelta(days=3), end(7), P.max_decision_lag) == end(11)


def test_a_lift_is_vetoed_by_an_open_window_one_carrier_of_which_shows_the_cause_back():
    """Issue 66's run 1 (an intermittent storm, quiet spells of 3 minutes): the lift decided on three quiet windows
    was published in the next episode's second minute, 610 msg/s admitted for a minute: the open window of the
    episode, before its census, summed less than the cap and read clear. Judged on the carriers that reported
    (a's line alone: 24.0 msg/s against its 60 % of the cap), it is at the cap and vetoes the lift."""
    state = limited(last_candidate_end=end(2), last_capped_end=end(2))
    quiet = [window(i, 2.0) for i in range(3, 6)]
    back = window(6, 24.0, complete=False, reported={"a"}, per_broker={"a": 24.0})
    decisions, _, evidence = fold_resource(state, [], end(5), P, observations=quiet, open_evidence=[back],
                                           now=end(6, 20))
    assert not any(d.action == "lift" for d in decisions)
    veto, = [e for e in evidence if e.status == Status.VETO]
    assert "the open window ending 07:06" in veto.detail and "so far: a reported" in veto.detail
    # the same window seen whole-cluster before a.s line landed says nothing: no carrier reported
    nothing = window(6, 0.0, complete=False, reported={"c"}, per_broker={})
    assert STORM.reported_share(state, nothing) is None


def test_no_probe_after_a_window_under_the_cap():
    """Issue 66's run 1: a probe was decided on the last capped window of an episode and published into the quiet
    spell. A probe is decided only while the newest window seen (final, or open on its reporting carriers) is at the
    cap."""
    state = limited(last_capped_end=end(3))
    capped = window(4, 39.5)
    quiet = window(5, 3.0, complete=False, reported={"a"}, per_broker={"a": 3.0})
    batch = Batch(end(4), end(5, 20), (capped,), (quiet,))
    assert STORM.newer_under_cap(state, capped, batch) is quiet
    assert STORM.capped(state, capped, "at the cap", batch).decisions == ()  # kept, not probed
    at_cap = window(5, 23.9, complete=False, reported={"a"}, per_broker={"a": 23.9})
    probe, = STORM.capped(state, capped, "at the cap", Batch(end(4), end(5, 20), (capped,), (at_cap,))).decisions
    assert probe.action == Action.RELAX and probe.limit_qps == 60.0


def test_a_probe_is_undone_on_the_first_window_that_shows_the_raise_taken_and_its_excess_is_stated():
    """A probe decided 07:04:10 is in force from 07:04:20 at the brokers: the window ending 07:05 ran 40 s under the
    raise, and a storm that takes it admits 53 msg/s there, over the level before by more than ``hysteresis_pct``.
    That window (a's line alone, before its census) undoes the probe, 50 s after the minute, and the undo says what
    the probe let through beyond 40 msg/s."""
    probe = decided_at(end(4, 10), end(4), P.max_decision_lag)
    state = limited(limit_qps=60.0, probe_from_qps=40.0, probe_decided_at=probe, probe_effective_end=end(6),
                    last_decision_end=end(3), previous_limit_qps=40.0, change_effective_end=end(6))
    took = window(5, 31.8, complete=False, reported={"a"}, per_broker={"a": 31.8})  # 53 msg/s at a's 60 %
    assert STORM.took_raise(state, took)
    undo, = STORM.act_on_open(state, Batch(end(3), end(5, 15), (), (took,))).decisions
    assert (undo.action, undo.limit_qps) == (Action.SET, 40.0)
    # (31.8 - 0.6 x 40) msg/s x 60 s: what a admitted beyond its share of the level before
    assert "probe undone" in undo.reason and "the probe admitted 468 messages beyond 40.0 msg/s" in undo.reason


def test_a_probe_no_window_answers_is_undone_at_its_deadline_however_late_its_evidence():
    """Issue 66's run 2: a probe stayed raised 5 minutes while a broker that carries none of the storm shipped 3
    minutes late, its undo waiting for that broker's census. A probe ends within ``probe_max_windows`` windows and a
    trigger of its decision, lifted or undone; a late non-carrier holds nothing back (the windows complete for the
    resource's own carriers count: ``carriers_reported``)."""
    state = limited(limit_qps=60.0, probe_from_qps=40.0, probe_decided_at=end(4, 10), probe_effective_end=end(6),
                    last_decision_end=end(3))
    deadline = STORM.probe_deadline(state)
    assert deadline == end(6, 20)
    assert STORM.act_on_open(state, Batch(end(3), end(6, 18), (), ())).decisions == ()
    undo, = STORM.act_on_open(state, Batch(end(3), end(6, 22), (), ())).decisions
    assert undo.limit_qps == 40.0 and "not lifted within 2 windows of the probe (decided 07:04:10)" in undo.reason
    late = window(6, 40.0, complete=False, reported={"a", "b"})  # c, which carries none of it, still to report
    assert STORM.carriers_reported(state, late) and not late.complete


def test_after_an_undo_the_pause_holds_and_a_cut_of_a_probe_counts_as_one():
    """Issue 66's run 3: two probes a minute apart, the rule's cut of the raise having reset the pause. An undo
    holds further probes ``recovery_windows`` × 2^n windows from the undo itself; a candidate that cuts a probe in
    flight (the rule fired under the raise) sets the same pause; a candidate of a window that ran before the raise
    says nothing of it."""
    state = limited(limit_qps=60.0, probe_from_qps=40.0, probe_decided_at=end(4, 10), probe_effective_end=end(6),
                    last_decision_end=end(4), previous_limit_qps=40.0, change_effective_end=end(6))
    fired = Candidate(end(6), 40.0, "storm at 6")
    cut, = STORM.on_window(state, end(6), fired, window(6, 60.0), Batch(end(6))).decisions
    after = STORM.on_window(state, end(6), fired, window(6, 60.0), Batch(end(6))).state
    assert cut.limit_qps == 40.0 and after.probe_hold_until == end(12) and after.probe_ceiling_qps == 60.0
    before = Candidate(end(5), 40.0, "storm at 5")  # ran at 40 msg/s: judged as such, no cut of the probe
    assert STORM.set(state, before, Batch(end(5))) is None


def test_a_decision_after_the_reconciliation_of_the_same_window_outranks_it():
    """Sweep case 24: the final path's answer to a preliminary decision (rank 6 of window 06:16) was followed by a
    probe's undo of the same window at rank 5: the brokers refused the undo as a stale version and held the raise.
    A final decision ranks after the newest row of its window."""
    undo = Decision("group", "g", end(16), 40.0, 60.0, Action.SET, "probe undone", 9)
    latest = {("group", "g"): {"version": int(end(16).timestamp()) * 10 + 6}}
    row, = finish([undo], LimitsConfig(), end(20), "final", latest)
    assert row["version"] == int(end(16).timestamp()) * 10 + 7
    row, = finish([dataclasses.replace(undo, window_end=end(17))], LimitsConfig(), end(20), "final", latest)
    assert row["version"] == int(end(17).timestamp()) * 10 + 5


def test_a_probe_the_demand_leaves_alone_lifts_a_fixed_consumer_within_its_cost():
    """Sweep cases 102 and 111: a fixed consumer retries 9.2-9.4 % of what it consumes, at 90-100 % of its 10 %
    limit: every window at the cap, so only a probe can tell. Its first whole window under the raise is clear and
    not over the level before (57.9 of 84.9, the level 56.6): the windows at the cap before it hid nothing, and the
    lift is timed from the last window where the rule fired, within the probe's two windows."""
    state = limited(limit_qps=60.0, probe_from_qps=40.0, probe_decided_at=end(4, 30), probe_effective_end=end(6),
                    last_decision_end=end(4), last_candidate_end=end(2), last_capped_end=end(4))
    applying = window(5, 38.0)
    answered = window(6, 41.0)  # 41 of 60: clear, and within hysteresis of the 40 before
    lift, = STORM.act_on_open(state, Batch(end(4), end(6, 25), (), (applying, answered))).decisions
    assert lift.action == Action.LIFT and "raised from 40.0 msg/s to see it" in lift.reason
    taken = window(6, 45.0)  # over 40 by more than hysteresis: the demand took part of the raise
    assert not any(d.action == Action.LIFT for d in STORM.act_on_open(
        state, Batch(end(4), end(6, 25), (), (applying, taken))).decisions)


def test_a_recurrence_is_damped_the_window_that_ran_under_an_undone_raise_judged_on_the_lower_value():
    """Sweep case 168 (an intermittent storm, 4 episodes, a 9.5 % legitimate retry): after a probe's undo the window
    that ran under the raise was judged against the lowered value: at its cap, a new probe a minute later (after a
    window under its cap); judged against the raise it read clear and a lift followed the undo by 7 s, the storm
    back. A window before a change's first whole window is judged against the lower of the two values, and no probe
    starts on it."""
    state = limited(limit_qps=40.0, previous_limit_qps=60.0, change_effective_end=end(8), recurrences=1)
    assert limit_in_force(state, end(7)) == 40.0 and limit_in_force(state, end(8)) == 40.0
    assert STORM.judge(window(7, 39.0), state).status == Status.CAPPED
    assert not any(d.action == Action.RELAX for d in STORM.capped(state, window(7, 39.0), "at the cap",
                                                                    Batch(end(7))).decisions)
    assert STORM.recovery_needed(state) == 6 and STORM.recovery_needed(dataclasses.replace(state, recurrences=2)) == 12
