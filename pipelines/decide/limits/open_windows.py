"""What the fast path's open windows let a limit's policy decide before they are final
(:meth:`OpenWindowSteps.act_on_open`, a mixin of :class:`pipelines.decide.limits.base.LimitPolicy`). Its steps pass
around :class:`~pipelines.decide.records.resource.Batch` (what a micro-batch tells each resource's walk) and
:class:`~pipelines.decide.records.resource.Judged` (a window under the enforced limit judged). Rates are
cluster-wide msg/s, times naive UTC window ends; docs/decisions.md §4.
"""

from __future__ import annotations

from dataclasses import replace

from pipelines.decide.records.resource import Batch, Judged, ResourceState
from pipelines.decide.limits.steps import Step
from pipelines.decide.words import Mode, Status


class OpenWindowSteps:
    """The open-window steps of :class:`pipelines.decide.limits.base.LimitPolicy` (its ``judge``, ``under_raise``,
    ``applying_raise``, ``took_raise``, ``on_open``, ``squeeze``, ``lift_point``, ``recovery_needed``, ``veto`` and
    ``lift``)."""

    def forgiven(self, state: ResourceState, raised: list) -> ResourceState:
        """The state a lift is timed from once every complete window wholly under a probe (``raised``: (window,
        status, detail)) is clear with its admitted rate at most the level before the probe: the demand fits the
        limit it was probed from, so the windows at the cap before the probe hid nothing (a fixed consumer's
        legitimate retries at 90-100 % of the limit): they keep it no longer, and the lift is timed from the last
        window where the rule fired, ``recovery_needed`` windows after it (a recurrence's doubled: flap damping).
        Else ``state``."""
        if state.probe_from_qps is None or not raised or any(
                self.took_level(state, o) for o, _status, _detail in raised):
            return state
        return replace(state, last_capped_end=None)

    def act_on_open(self, state: ResourceState, batch: Batch, decided: bool = False) -> Step:
        """What the fast path's open windows after the horizon, complete by census (their stats final, their sums
        only growing), let the final path decide now, as a decision of the horizon's window: a probe whose whole
        window shows the demand following it is undone; the first of them (in window order, as the final path folds
        them) whose carrier was busy at the cap squeezes the limit (:meth:`squeeze`: the clients' busy failures ship
        on their own clocks, the newest window may not show them yet); a probe whose whole windows are clear for
        :meth:`recovery_needed` windows since the last window that kept the limit proves the lift; the newest window
        at the cap with its demand hidden starts a probe (:attr:`probe_on_open`). Once every complete window wholly
        under a probe is clear, the open window the probe was decided in (:meth:`applying_raise`: after the evidence
        that started it, it ran at the level before while the raise was published) does not keep the limit if it
        is at the cap: it asks what the windows under the raise answered, the demand below the raised cap. The window
        that started the probe and any
        ``bound`` or ``hold`` window still keep it. When a decision of the horizon's window was made already (the
        final path confirming the fast path's limit, say), only a squeeze: the broker forces it, and waiting for
        the next batch leaves the bystanders a minute more of its busy refusals. In a backlog run the same windows
        come final and lead to the same decisions later (a lift later still: the final path, which cannot see the
        windows under the raise yet, counts that window at the cap as keeping the limit).

        The final path runs this at every trigger, with or without a window finalized, so that what a carrier's
        line shows is answered within a trigger (``decided``: a decision of the horizon's window was taken earlier
        in the same fold). A probe is undone on the first window that shows the demand taking it, whole or not
        (:meth:`took_raise`), and when none has answered it by its deadline (:meth:`probe_overdue`)."""
        s, horizon = state, batch.horizon_end
        if s.limit_qps is None or s.mode != Mode.ENFORCE or horizon is None:
            return Step(s)
        if s.last_decision_end == horizon and not self.may_decide_again(s):
            return Step(s)
        step = self.open_steps(s, batch, decided)
        if not step.decisions and self.probe_on_open and self.probe_overdue(s, batch):
            # neither lifted nor undone by its deadline
            return step.then(self.undo_overdue(s, batch, left_alone=self.left_alone(s, batch)))
        return step

    def left_alone(self, state: ResourceState, batch: Batch) -> bool:
        """Whether a whole window under the probe in flight, complete for the resource (:meth:`carriers_reported`),
        shows the demand leaving the raise alone: clear, and not over the level before (:meth:`took_level`)."""
        s = state
        under = [o for o in (*batch.observations, *batch.opened)
                 if self.under_raise(s, o) and self.carriers_reported(s, o)]
        return bool(under) and all(self.judge(o, s).status == Status.CLEAR and not self.took_level(s, o)
                                   for o in under)

    def open_steps(self, state: ResourceState, batch: Batch, decided: bool) -> Step:
        """:meth:`act_on_open` but for the probe's deadline (same arguments)."""
        s, horizon = state, batch.horizon_end
        done = sorted((o for o in batch.opened if o.window_end > horizon and self.carriers_reported(s, o)),
                      key=lambda o: o.window_end)
        if not done and not (self.probe_on_open and s.probe_from_qps is not None):
            return Step(s)
        judged = [(o, *self.judge(o, s)) for o in done]
        squeezed = next((q for o, status, detail in judged  # in window order, as the final path will fold them
                         if (q := self.squeeze(s, o, Judged(status, detail), at=horizon)) is not None), None)
        if decided and s.last_decision_end == horizon:  # decided on the horizon in this fold: only a squeeze
            return squeezed or Step(s)
        raised = [(o, status, detail) for o, status, detail in judged if self.under_raise(s, o)]
        following = next(((o, st, d) for o, st, d in raised if st in (Status.BOUND, Status.CAPPED)), None)
        if self.probe_on_open:  # a probe's undo needs no whole window: a carrier's line, or the applying window
            took = next((o for o in sorted(batch.opened, key=lambda o: o.window_end)
                         if o.window_end > horizon and self.took_raise(s, o)), None)
            following = (took, *self.judge(took, s)) if took is not None else following
        if following is not None:
            return self.on_open(s, *following, batch) or Step(s)
        if squeezed is not None:
            return squeezed
        if not done or s.last_candidate_end is None:
            return Step(s)
        answered = bool(raised) and all(status == Status.CLEAR for _, status, _ in raised)
        timed = self.forgiven(s, raised) if answered else s
        exempt = {o.window_end for o, status, _ in judged if answered and status == Status.CAPPED and (
            self.applying_raise(s, o) or (
                timed is not s and o.window_end < s.probe_effective_end and not self.took_level(s, o)))}
        kept = [o.window_end for o, status, _ in judged if status != Status.CLEAR and o.window_end not in exempt]
        newest, status, detail = judged[-1]
        if not kept:  # every complete open window clear: the proof of a lift, when enough of them
            ends = {o.window_end for o in done}
            # under a probe its clear windows prove the lift; otherwise the clear windows a final lift needs and a
            # window after them that a carrier has reported in (the veto reads it): a quiet spell no longer than
            # them shows its next episode there (the final path, 2-3 minutes behind, would lift where the open
            # windows say nothing yet)
            lift_at = self.lift_point(timed)
            needed = [lift_at - self.params.window * k for k in range(self.recovery_needed(s))]
            later = raised or any(o.window_end > lift_at and self.reported_share(s, o) is not None
                                  for o in batch.opened)
            if later and lift_at <= done[-1].window_end and all(e in ends or e <= horizon for e in needed):
                veto = self.veto(s, lift_at, batch, exempt)
                if veto is not None:
                    return Step(s, evidence=(veto,))
                newest = done[-1].window_end
                under = " under the probe" if raised else ""
                return self.lift(s, horizon, f" (the open window ending {newest:%H:%M}, complete by census{under}: "
                                             f"{judged[-1][2]})", proven_to=newest)
            return Step(s)
        if status == Status.CAPPED and self.probe_on_open:
            return self.on_open(s, newest, status, detail, batch) or Step(s)
        return Step(s)

