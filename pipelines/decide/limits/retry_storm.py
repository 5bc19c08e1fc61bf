"""``RUNAWAY_RETRY``'s limit: a consumer group's retry traffic, its whole life (:class:`RetryStormLimit`).

**Visible demand.** The retry traffic the brokers admitted (per broker the larger of the send-backs and the plain
sends to ``%RETRY%<group>``, :func:`pipelines.decide.rules.facts.retry_traffic`), the logged rejections of
``%RETRY%<group>`` (in practice none: a refused send-back is answered to the consumer, and its client's fallback
send fails inside the client), and the refused send-backs the **fallback sends** reveal: a consumer client whose
send-back a broker refuses sends the message to ``%RETRY%<group>`` as a plain send through its own producer
(apache/rocketmq ``DefaultMQPushConsumerImpl.sendMessageBack`` → ``sendMessageBackAsNormalMessage``, group
``CLIENT_INNER_PRODUCER``), into the same limiter (Sohu's ``RateLimitHandler`` keys both by ``%RETRY%<group>``,
sohutv/rocketmq 5.3.1-sohu-01). The brokers print those as puts of the retry topic beyond the send-backs; with
send-backs admitted at a rate a ≤ 1 and the fallbacks at the same rate, fallbacks ÷ send-backs ≈ the refused share
ρ = 1 − a, so the demand is at least the admitted traffic ÷ (1 − ρ) (ρ at most :data:`REFUSED_SHARE_MAX`).

**Gone** = :func:`pipelines.decide.rules.facts.retry_fires` silent on the visible demand against the group's consume
rate *in the same window*, its ratio alone (the cap holds the retries far under the rule's floor; with nothing consumed,
the retries below ``retry_floor_tps``).

**Set** once at its frozen target (10 % of the group's normal consume rate; a first limit no higher than the room
its busy carriers leave beside their normal writes, :meth:`RetryStormLimit.first_bound`); a first cut bounded by
``max_cut_pct`` goes down to the target in one step once the cool-down is over. **Probe**: a broken consumer at its
cap is ``bound`` by its fallback sends and never probed (at most one change), nor is one whose fallback sends read
every send-back refused (:data:`REFUSED_SHARE_MAX`) under a limit so far below its consume rate that the ratio of
that reading (20× the cap) stays under the rule's: the demand is at least 20× the cap, and a probe lifts only on a
window under its raise below the raised cap (a cold start's limit, 10 % of a storm's depressed consume rate, can
sit at a few percent of the rate under the limit); a fixed one whose legitimate retries
sit just under the cap is ``capped``, probed at once ×``relax_factor`` on the first such window (final, or open
and complete by census), back at once when the admitted rate follows the raise, lifted after clear windows under
it. A client without the fallback shows no refused demand: its storm at the cap is ``capped`` too, and each probe
costs one window at the raised cap, then a doubling pause.
"""

from __future__ import annotations

import datetime as dt
import math

from pipelines.decide.limits.base import LimitPolicy
from pipelines.decide.limits.steps import Step, backoff_hold, decided_at, higher, too_small
from pipelines.decide.records.resource import (
    Batch, Candidate, Observation, ResourceState, in_transition, limit_in_force,
)
from pipelines.decide.rules.facts import REFUSED_SHARE_MAX, most_refused_share, retry_fires, retry_ratio
from pipelines.decide.words import Anomaly, Status



class RetryStormLimit(LimitPolicy):
    """``RUNAWAY_RETRY``: limits a consumer group's retry traffic (module docstring)."""

    kind = Anomaly.RUNAWAY_RETRY
    probe_on_open = True

    def first_bound(self, cand: Candidate) -> tuple[float, str] | None:
        """The room its busy carriers leave (:meth:`LimitPolicy.start` applies it): the highest first limit (msg/s
        cluster-wide) under which each busy carrier (``cand.busy_load``: its writes W in the window, msg/s) takes its
        usual senders' normal writes (``cand.busy_normal``: N, msg/s) and the storms' together, and a text saying
        why; not below ``min_limit_qps``. A busy broker writes its capacity and
        takes the same share ``a`` of every sender's sends (apache/rocketmq ``BrokerFastFailure``; ``a``: the group's
        admitted retry traffic ÷ the demand the rule read through it): its usual senders wrote ``a N``, the storms on
        it the rest, ``W - a N`` (a send-back costs a broker more than one write: the schedule topic, the re-put; no
        stats line names them). Every storm there must shrink to the room ``h W - N`` ÷ ``W - a N`` of what it was
        admitted, whichever share of it each takes (``h``: ``storm_room_share``, 0.95: a carrier filled to W stays
        busy, since a limiter rejecting most of a storm bursts as its breaker closes; docs/decisions.md §8 has the
        runs behind 0.95). None without a busy carrier with a normal, or when no carrier's room binds (a broker with
        the room of the target: most of them)."""
        p = self.params
        admitted = sum(cand.broker_tps.values())
        if admitted <= 0 or not cand.busy_normal:
            return None
        accepted = min(admitted / cand.observed_tps, 1.0) if cand.observed_tps else 1.0
        best, why = math.inf, ""
        for broker, normal in sorted(cand.busy_normal.items()):
            busy = cand.busy_load.get(broker)
            if busy is None or broker not in cand.broker_tps:
                continue
            storms = busy - accepted * normal
            if storms <= 0:
                continue
            room = max(p.storm_room_share * busy - normal, 0.0)
            if admitted * room / storms < best:
                best, why = admitted * room / storms, (
                    f"{broker} wrote {busy:.1f} msg/s busy against {normal:.1f} normal, about {storms:.1f} of them the "
                    f"storms' at {accepted:.0%} accepted")
        if not math.isfinite(best):
            return None
        bound = max(best, p.min_limit_qps)
        return bound, (f"bounded to {bound:.1f} msg/s by the room its busy carrier leaves: {why}; the storms there "
                       f"fit in {p.storm_room_share:g} of what it wrote busy beyond its normal")

    def visible(self, obs: Observation) -> tuple[float, str]:
        """Admitted + logged rejections, or what the fallback sends reveal when that is more (msg/s)."""
        demand, _ = super().visible(obs)
        refused = self.refused_share(obs)
        if refused is None:
            return demand, ""
        fallback = obs.observed_tps - obs.sendback_tps
        sent = obs.sendback_tps
        hidden = obs.observed_tps / (1.0 - refused)
        if hidden <= demand:
            return demand, ""
        return hidden, (f"fallback sends {fallback:.1f} msg/s beside {sent:.1f} msg/s of send-backs: about "
                        f"{refused:.0%} of the send-backs refused, a demand of {hidden:.1f} msg/s")

    def view_hides_demand(self, obs: Observation) -> bool:
        """A carrier busy in the window hides the demand (it fast-fails send-backs before the limiter sees them, and
        a refused send-back leaves no log line). The limiter's view hides no demand where the fallback sends count
        the refused send-backs (a refused share under :data:`REFUSED_SHARE_MAX`): the view tells only that the
        limiter refused some, and :meth:`visible` counts them already (a fixed consumer's legitimate retries refused
        in bursts would otherwise wait for a probe to be lifted)."""
        refused = self.refused_share(obs)
        if obs.busy_brokers:  # a busy carrier fast-fails send-backs before its limiter, unlogged: what it admitted
            return True       # under the cap says nothing of the demand (a probe's raise that made it busy: undone)
        return obs.viewed and (refused is None or refused >= REFUSED_SHARE_MAX)

    @staticmethod
    def refused_share(obs: Observation) -> float | None:
        """The refused share of the group's send-backs its fallback sends reveal in ``obs``: the most they can mean
        (:func:`~pipelines.decide.rules.facts.most_refused_share`); None when the window shows no fallback sends."""
        return most_refused_share(obs.observed_tps, obs.sendback_tps)

    def fires(self, demand: float, obs: Observation, state: ResourceState) -> tuple[bool, str]:
        """:func:`~pipelines.decide.rules.facts.retry_fires` of the visible demand against the window's consume rate
        (msg/s), its ratio alone (``floor=False``); an open window before its census against the larger of its
        partial consume rate and the one frozen with the limit."""
        det = self.params.detection
        consume = obs.consume_tps or 0.0
        if not obs.complete:  # an open window before its census: the consume rate is partial; judged against the
            consume = max(consume, state.baseline_tps or 0.0)  # rate frozen with the limit too, so it only errs late
        fires = retry_fires(demand, consume, det, floor=False)
        ratio = retry_ratio(demand, consume)
        if ratio is not None:
            return fires, (f"visible retry demand {demand:.1f} msg/s, ratio {ratio:.2f} against {consume:.1f} msg/s "
                           f"consumed (rule: >= {det.retry_ratio_threshold:.2f})")
        return fires, (f"visible retry demand {demand:.1f} msg/s with nothing consumed (rule: retry >= "
                       f"{det.retry_floor_tps:.1f} msg/s then)")

    def hold(self, state: ResourceState, obs: Observation, status: Status, detail: str, batch: Batch) -> Step:
        """A probe whose window shows the cause is undone at once; otherwise the first cut was bounded by
        ``max_cut_pct``: while the cause persists above the frozen target, the limit goes down to it once the
        cool-down is over (one step, so a persisting storm sees at most one change after its first limit)."""
        end = obs.window_end
        if self.under_raise(state, obs) or self.took_raise(state, obs):
            return self._undo(state, obs, detail, end, batch)
        if not self.before_raise(state, obs) and self.cut_due(state, end):
            return self.cut_to_target(state, end, detail)
        return super().hold(state, obs, status, detail, batch)

    def capped(self, state: ResourceState, obs: Observation, detail: str, batch: Batch) -> Step:
        """At the cap on healthy carriers, probed at once (or a probe the admitted rate followed undone); else kept,
        refreshed when due (under the cap, its demand hidden by a busy carrier or the limiter's view, or with a
        carrier busy, it is kept: no probe)."""
        step = self._probe_or_undo(state, obs, detail, obs.window_end, batch)
        return step if step is not None else super().capped(state, obs, detail, batch)

    def on_open(self, state: ResourceState, obs: Observation, status: Status, detail: str,
                batch: Batch) -> Step | None:
        """A complete open window at the cap with its demand hidden starts a probe now; one wholly under a probe that
        the admitted rate follows (``capped`` or ``bound``) undoes it; as decisions of the horizon's window."""
        if status == Status.CAPPED or self.took_raise(state, obs):
            whole = "complete by census" if obs.complete else "its carriers' lines so far"
            return self._probe_or_undo(state, obs, f"the open window ending {obs.window_end:%H:%M}, {whole}: {detail}",
                                       batch.horizon_end, batch)
        return None

    def _probe_or_undo(self, state: ResourceState, obs: Observation, detail: str, at: dt.datetime,
                       batch: Batch) -> Step | None:
        """Undo a probe whose window the admitted rate followed; a first cut still above the frozen target after
        the cool-down, down to the target; or start a probe; as a decision of the window ending ``at``; None when
        none is due. A probe is an experiment on a cause at its cap: none starts on a window under
        ``bound_share`` of its cap (the demand hidden only by a busy carrier or the limiter's view: the cause may have
        ended, and a raise cannot tell), nor on one with a carrier busy in it (a raise would load that broker more;
        the squeeze answers a busy carrier, :meth:`LimitPolicy.squeeze`), nor on one whose fallback sends read every
        send-back refused (module docstring)."""
        p = self.params
        if state.probe_from_qps is not None:
            if self.took_raise(state, obs):
                return self._undo(state, obs, detail, at, batch)
            return None  # the raise is not in force in this window yet, or the window does not answer it
        if self.cut_due(state, obs.window_end) and not in_transition(state, obs.window_end):
            # a first cut bounded by max_cut_pct, its demand at the cap after the cool-down: the cause outlived it
            # (what shows of a storm at its cap, its fallback sends aside, stays under the rule's ratio)
            return self.cut_to_target(state, at, detail)
        if state.probe_hold_until is not None and obs.window_end < state.probe_hold_until:
            return None
        part = self.reported_share(state, obs)
        if part is None:
            return None
        cap = limit_in_force(state, obs.window_end) * part
        if obs.observed_tps > higher(cap, p.hysteresis_pct):
            return None  # over its cap: the limit did not hold in it (a carrier not applying it), nothing hidden
        if not self.at_cap(obs, cap):
            return None  # under its cap, the demand hidden by a busy carrier or the limiter's view: no experiment
        if obs.busy_brokers:
            return None  # a carrier busy in it: a raise would load it more (the squeeze answers a busy carrier)
        if in_transition(state, obs.window_end):
            return None  # it ran partly under another value: no window under the value to raise
        if self.newer_under_cap(state, obs, batch) is not None:
            return None  # the cause may have ended: no experiment after a window under the cap
        if self.refused_share(obs) == REFUSED_SHARE_MAX:
            return None  # a demand of 20x the cap or more: no window under a raise would be clear
        current = state.limit_qps
        raised, bounds = self.raise_bounds(state, obs, current, current * p.relax_factor)
        if too_small(raised, current, p.hysteresis_pct):
            return None
        how = f"x{p.relax_factor}" if not bounds else f"to {raised:.1f} msg/s ({'; '.join(bounds)})"
        return self.raise_to(state, at, raised, f"probe: {detail}; raised {how} to see the demand: back to "
                                                f"{current:.1f} msg/s at once if the admitted rate follows, lifted if "
                                                "it does not", batch)

    def _undo(self, state: ResourceState, obs: Observation | None, detail: str, at: dt.datetime,
              batch: Batch, taken: bool = True) -> Step:
        """Back to the level before the probe; the raised level a ceiling for a doubling interval (from the window
        that answered it, or the one the undo is decided on; ``taken`` False, a probe the demand left alone: for
        ``recovery_windows``, the interval not doubled); what the probe admitted beyond the level before
        (:meth:`probe_excess`) in the reason and in the state."""
        p = self.params
        back, raised = state.probe_from_qps, state.limit_qps
        backoff = state.probe_backoff + 1 if taken else state.probe_backoff
        hold = backoff_hold(p.window, p.recovery_windows, backoff) if taken else p.window * p.recovery_windows
        excess = self.probe_excess(state, batch, obs)
        anchor = max(obs.window_end if obs is not None else at,  # the pause runs from the undo's own time, at least
                     decided_at(batch.now, batch.stream_end(at), p.max_decision_lag) if batch.now is not None else at)
        return self.back_from_probe(
            state, at, back, f"probe undone: {detail}; back to {back:.1f} msg/s, and no probe reaches {raised:.1f} "
            f"msg/s for {hold.total_seconds() / 60:g} min; the probe admitted {excess:.0f} messages beyond "
            f"{back:.1f} msg/s", anchor + hold, backoff, probe_decided_at=None, probe_excess_messages=excess)

    def undo_overdue(self, state: ResourceState, batch: Batch, left_alone: bool = False) -> Step:
        """A probe neither undone nor lifted by its deadline (:meth:`probe_overdue`), undone as a decision of the
        horizon's window; ``left_alone``: a whole window under it showed the demand leaving it alone
        (:meth:`left_alone`), so the next probe waits ``recovery_windows`` only."""
        waited = (f"not lifted within {self.params.probe_max_windows} windows of the probe (decided "
                  f"{state.probe_decided_at:%H:%M:%S}), its stated cost" + (
                      ", the demand leaving the raise alone" if left_alone else ""))
        return self._undo(state, None, waited, batch.horizon_end, batch, taken=not left_alone)
