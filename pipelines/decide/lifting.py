"""When a limit is lifted: the windows since the last one that kept it, the veto of a later window that is not
clear, and the fast path's open windows that start, undo or prove a probe. A mixin of
:class:`pipelines.decide.fold.Fold` (its state, policy, decisions and evidence); docs/decisions.md §4.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from pipelines.decide.fold_types import Evidence, recovery_needed
from pipelines.decide.words import Action, Mode, Status


class Lifting:
    """The lift of :class:`pipelines.decide.fold.Fold`."""

    def vetoed(self, lift_at: dt.datetime) -> bool:
        """A window after ``lift_at`` is not clear: a later final window of this micro-batch, or an open window
        the fast path has seen (:attr:`opened`; before its census a ratio rule takes the larger of its partial
        consume rate and the one frozen with the limit). Then no lift now (a ``veto`` evidence row)."""
        s = self.state
        if s.mode != Mode.ENFORCE or self.policy is None:
            return False
        later = [o for o in self.observations if o.window_end > lift_at] + [
            o for o in self.opened if o.window_end > lift_at]
        for obs in later:
            status, detail = self.policy.judge(obs, s, self)
            if status != Status.CLEAR:
                where = "open window" if obs in self.opened else "final window"
                self.evidence.append(Evidence(obs.window_end, Status.VETO, s.limit_qps, obs.observed_tps, obs.rejected,
                                              f"lift vetoed: the {where} ending {obs.window_end:%H:%M} shows the "
                                              f"cause back: {detail}"))
                return True
        return False

    def last_seen(self) -> dt.datetime:
        """The end of the last window that keeps the limit: the cause seen (a rule fired, ``bound``, ``hold``) or
        the demand hidden at the cap (``capped``): a lift counts its windows from there."""
        s = self.state
        return max(x for x in (s.last_candidate_end, s.last_capped_end) if x is not None)

    def lift_point(self) -> dt.datetime:
        """The end of the window after which the limit may be lifted: :func:`recovery_needed` windows after
        :meth:`last_seen`, and after the window of the last decision."""
        s = self.state
        seen = self.last_seen()
        return max(seen + self.window * recovery_needed(s.recurrences, self.cfg),
                   (s.last_decision_end or seen) + self.window)

    def act_on_open(self) -> None:
        """What the fast path's open windows after the horizon, complete by census (their stats final, their sums
        only growing), let the final path decide now, as a decision of the horizon's window: a probe whose whole
        window shows the demand following it is undone; a probe whose whole windows are clear for
        :func:`recovery_needed` windows since the last window that kept the limit proves the lift; the newest window
        at the cap with its demand hidden starts a retry-storm limit's probe. Nothing when a decision of that window
        was made already. In a backlog run the same windows come final and lead to the same decisions later."""
        s, horizon = self.state, self.horizon_end
        if (self.policy is None or s.limit_qps is None or s.mode != Mode.ENFORCE or horizon is None
                or s.last_decision_end == horizon):
            return
        done = sorted((o for o in self.opened if o.window_end > horizon and o.complete), key=lambda o: o.window_end)
        if not done:
            return
        judged = [(o, *self.policy.judge(o, s, self)) for o in done]
        kept = [o.window_end for o, status, _ in judged if status != Status.CLEAR]
        raised = [(o, status, detail) for o, status, detail in judged if self.policy.under_raise(s, o)]
        following = next(((o, st, d) for o, st, d in raised if st in (Status.BOUND, Status.CAPPED)), None)
        if following is not None:
            self.policy.on_open(self, *following)
            return
        if raised and not kept:  # every complete window under the probe clear: the proof, when enough of them
            ends = {o.window_end for o in done}
            lift_at = self.lift_point()
            needed = [lift_at - self.window * k for k in range(recovery_needed(s.recurrences, self.cfg))]
            if lift_at <= done[-1].window_end and all(e in ends or e <= horizon for e in needed) \
                    and not self.vetoed(lift_at):
                o = done[-1]
                self.lift(horizon, f" (the open window ending {o.window_end:%H:%M}, complete by census, under the "
                                   f"probe: {judged[-1][2]})", proven_to=o.window_end)
            return
        newest, status, detail = judged[-1]
        if status == Status.CAPPED and self.policy.probe_on_open:
            self.policy.on_open(self, newest, status, detail)

    def recover(self, until: dt.datetime) -> None:
        s = self.state
        if s.limit_qps is None or s.last_candidate_end is None:
            return
        needed = recovery_needed(s.recurrences, self.cfg)
        lift_at = self.lift_point()
        rule = self.policy.kind.value if self.policy is not None else "the"
        if lift_at > until or self.vetoed(lift_at):
            if s.mode == Mode.ENFORCE and s.last_candidate_end < until:  # held through clear windows
                why = (self.evidence[-1].detail if lift_at <= until else
                       f"{rule} silent since {self.last_seen():%Y-%m-%dT%H:%M:%SZ}, lifted after {needed} clear "
                       "windows")
                self.refresh(until, f"refresh (held: {why}; in force until it is lifted)")
            return
        self.lift(lift_at)

    def lift(self, at: dt.datetime, proof: str = "", proven_to: dt.datetime | None = None) -> None:
        """Lift the limit as a decision of the window ending ``at`` (remembered by the recurrence memory when
        enforced); ``proof``: the open windows that proved it, when not the final ones, up to the window ending
        ``proven_to``: the lift is remembered there, so that those windows, once final, cannot limit again
        (:meth:`pipelines.decide.fold.Fold.on_candidate`)."""
        s = self.state
        needed = recovery_needed(s.recurrences, self.cfg)
        rule = self.policy.kind.value if self.policy is not None else "the"
        why = (f"the cause is gone: {rule} did not fire on the visible demand (what the brokers admitted and the "
               f"limiter rejected) under the {s.limit_qps:.1f} msg/s limit"
               if s.mode == Mode.ENFORCE else "anomaly absent")
        if s.mode == Mode.ENFORCE and s.probe_from_qps is not None:
            why += f", raised from {s.probe_from_qps:.1f} msg/s to see it"
        damped = f", doubled for each of {s.recurrences} recurrences" if s.recurrences else ""
        at_cap = (f", at the cap with its demand hidden until {s.last_capped_end:%Y-%m-%dT%H:%M:%SZ}"
                  if s.mode == Mode.ENFORCE and s.last_capped_end is not None
                  and s.last_capped_end > s.last_candidate_end else "")
        self.emit(at, s.limit_qps, Action.LIFT,
                  f"{why} since {s.last_candidate_end:%Y-%m-%dT%H:%M:%SZ}{at_cap} ({needed} windows{damped}){proof}: "
                  "the limit is doing nothing and is lifted, brokers fall back to their defaults", s.mode,
                  remember=True)
        if proven_to is not None and self.state.last_lift_end is not None:
            self.state = replace(self.state, last_lift_end=max(self.state.last_lift_end, proven_to))
