"""Preliminary → final reconciliation: the one owner of how the two speeds' decisions meet.

The fast path decides on open windows (basis ``preliminary``), the final path on finalized ones (basis ``final``);
this module owns every rule between them:

* **Versions**: :mod:`pipelines.decide.records.limit_rows` (:data:`~pipelines.decide.records.limit_rows.VERSION_RANK`,
  :data:`~pipelines.decide.records.limit_rows.RECONCILE_RANK`).
* **The fast path's starting point** (:func:`preliminary_state`): the final path's saved state with the newer
  preliminary limit in force, which the limit takes in itself (:meth:`pipelines.decide.limits.base.LimitPolicy.adopt`);
  reconciliation hands it the row and never writes a state field.
* **The final path's answer** (:func:`reconcile_preliminary`): confirm (no row), correct (``set``) or reverse
  (``lift``) each preliminary ``set`` of a window that is now final; :func:`state_after` is the policy state after a
  fold, the input of that answer.
* **Which decision is in force**: the newest row per resource by ``version`` (:func:`latest_per_resource`), read by
  both paths and by every publish.

Rows are dicts by column (``gold/limits``, ``state/policy``; times UTC).
"""

from __future__ import annotations

import datetime as dt

from pipelines.columns import Key
from pipelines.config import GovernorConfig
from pipelines.decide.arrow import aware, figures, naive
from pipelines.decide.rules import facts
from pipelines.decide.rules.facts import close, shares_from_figures, shares_of
from pipelines.decide.words import Action, Basis, Mode
from pipelines.decide.records.limit_rows import RECONCILE_RANK, burst_for, decision_version
from pipelines.decide.records.resource import PendingPreliminary
from pipelines.decide.limits.base import LimitPolicy
from pipelines.decide.paths.fold_all import state_of, state_row
from pipelines.decide.text import fixed, stamp



def latest_per_resource(rows: list[dict]) -> dict[Key, dict]:
    """``gold/limits`` rows → the newest row per (resource_type, resource) by ``version`` (the last of equal ones)."""
    out: dict[Key, dict] = {}
    for row in rows:
        key = (row["resource_type"], row["resource"])
        if key not in out or row["version"] >= out[key]["version"]:
            out[key] = row
    return out


def lift_reach_seconds(windows) -> int:
    """How long after a lift the windows still to be finalized may have run under its limit (seconds): the
    watermark, a window's length and a trigger (``windows``: :class:`pipelines.config.WindowsConfig`)."""
    return windows.watermark_seconds + windows.length_seconds + windows.trigger_seconds


def read_as_limited(limited: tuple[str, ...], lifted: dict[Key, dt.datetime], now: dt.datetime,
                    seconds: float) -> tuple[str, ...]:
    """``"<resource_type>\\x1f<resource>"`` keys of the resources with a limit in the saved state (``limited``) and
    of those whose limit was lifted less than ``seconds`` before ``now`` (``lifted``: when each resource's newest
    ``lift`` was decided; UTC): the windows still to be finalized may have run under that limit (``seconds``:
    :func:`lift_reach_seconds`). A group among them is not read through its fallback sends, which count its
    limiter's refusals too (:func:`pipelines.decide.rules.windows.resource_traffic`,
    :func:`pipelines.decide.rules.open_retry.open_retry_traffic`): an operator's pin lifted with the storm still on read
    its windows under the pin at 190.9 msg/s, and the rules' first cut was 95.4 msg/s, 2.4x the pin
    (tests/sim/test_overrides_loop.py)."""
    since = aware(now) - dt.timedelta(seconds=seconds)
    recent = {f"{t}\x1f{r}" for (t, r), at in lifted.items() if at is not None and aware(at) > since}
    return tuple(sorted(set(limited) | recent))


def preliminary_state(saved: dict[Key, dict], latest: dict[Key, dict],
                      complete: dict[tuple, dict[str, float]] | None = None) -> dict[Key, dict]:
    """The state the fast path folds from: the final path's saved state (``state/policy`` rows by key), with the
    limit of a newer preliminary decision in force, taken in by the limit itself
    (:meth:`pipelines.decide.limits.base.LimitPolicy.adopt`: not decided again every micro-batch; a first one's
    target and per-broker shares frozen as the final path will freeze them). Those shares are its window's complete
    traffic where the window is complete by census now (``complete``:
    :func:`pipelines.decide.paths.open_split.complete_traffic`), else its ``broker_limits``. Rows keep their other
    columns (an override's ``override_id``)."""
    out = {key: dict(row) for key, row in saved.items()}
    for key, limit in latest.items():
        if limit["basis"] != Basis.PRELIMINARY:
            continue
        row = out.get(key) or {"resource_type": key[0], "resource": key[1], "version": 0}
        p_limit = limit["limit_qps"] if limit["action"] != Action.LIFT else None
        shares = None
        if p_limit:
            whole = shares_of((complete or {}).get((*key, naive(limit["window_end"])), {}))
            shares = whole or shares_from_figures(figures(limit.get("broker_limits")), p_limit)
        adopted = LimitPolicy.adopt(state_of(row), p_limit, naive(limit["window_end"]), Mode(limit["mode"]), shares)
        out[key] = {**row, **state_row(adopted)}
    return out


def pending_preliminary(latest: dict[Key, dict]) -> dict[Key, PendingPreliminary]:
    """The newest ``gold/limits`` row per resource (:func:`latest_per_resource`) → where it is a preliminary ``set``:
    (its window end, naive UTC; its limit, msg/s cluster-wide; its mode). The final path's fold keeps that value
    when its own start is within ``hysteresis_pct`` of it (:meth:`pipelines.decide.limits.base.LimitPolicy.start`)."""
    return {key: PendingPreliminary(naive(row["window_end"]), float(row["limit_qps"]), str(row["mode"]))
            for key, row in latest.items()
            if row["basis"] == Basis.PRELIMINARY and row["action"] == Action.SET and row["limit_qps"] is not None}


def same_figures(a: dict | None, b: dict | None) -> bool:
    """Two per-broker figure maps (``broker_limits``; None: none) list the same brokers at the same figures
    (:func:`~pipelines.decide.rules.facts.close`)."""
    if a is None and b is None:
        return True
    if a is None or b is None or sorted(a) != sorted(b):
        return False
    return all(close(a[k], b[k]) for k in a)


def reconcile_preliminary(latest: dict[Key, dict], final_limits: list[dict], final_state: dict[Key, dict],
                          horizon_end: dt.datetime, cfg: GovernorConfig, now: dt.datetime) -> list[dict]:
    """The final path's answer to preliminary decisions on windows that are now final → ``gold/limits`` rows.

    For each resource whose newest decision is a preliminary ``set`` of a window ending at or before
    ``horizon_end`` (UTC) and that this batch did not decide again (no final row of that window or later):

    * the final policy state has no limit for it (the final window did not confirm the anomaly) → ``lift``: the
      preliminary limit is reversed, with its own reason;
    * the final state's limit (or its per-broker split) differs → ``set`` to the final limit;
    * the same limit → confirmed, no row.

    Rows are basis ``final``, ``version`` of the preliminary window with rank
    :data:`~pipelines.decide.records.limit_rows.RECONCILE_RANK`.
    """
    horizon = aware(horizon_end)
    decided = aware(now)
    out = []
    for key in sorted(latest):
        p = latest[key]
        if p["basis"] != Basis.PRELIMINARY or p["action"] != Action.SET or aware(p["window_end"]) > horizon:
            continue
        if any((f["resource_type"], f["resource"]) == key and aware(f["window_end"]) >= aware(p["window_end"])
               for f in final_limits):
            continue
        state = final_state.get(key) or {}
        final_qps = state.get("limit_qps")
        final_split = None if final_qps is None else facts.split(final_qps, figures(state.get("broker_shares"))) or None
        p_split = figures(p.get("broker_limits")) or None
        split_differs = not same_figures(p_split, final_split)
        same_value = final_qps is not None and close(p["limit_qps"], final_qps)
        if final_qps is not None and same_value and not split_differs:
            continue
        window = stamp(aware(p["window_end"]))
        if final_qps is None:
            reason = (f"[final] the final window ending {window} did not confirm the preliminary limit of "
                      f"{fixed(p['limit_qps'], 1)} msg/s; reversed, brokers fall back to their defaults")
            limit = p["limit_qps"]
        elif split_differs and same_value:
            reason = (f"[final] the final window ending {window} splits the {fixed(final_qps, 1)} msg/s limit over its "
                      "brokers by their complete traffic (the preliminary split saw part of the window)")
            limit = final_qps
        else:
            reason = (f"[final] the final window ending {window} sets {fixed(final_qps, 1)} msg/s where the "
                      f"preliminary decision on partial evidence set {fixed(p['limit_qps'], 1)} msg/s")
            limit = final_qps
        out.append({
            "decided_at": decided, "window_end": aware(p["window_end"]), "resource_type": key[0],
            "resource": key[1], "limit_qps": limit, "burst": burst_for(limit, cfg.limits),
            "previous_qps": p["limit_qps"], "action": Action.LIFT if final_qps is None else Action.SET,
            "mode": p["mode"], "expires_at": decided + dt.timedelta(seconds=cfg.limits.ttl_seconds),
            "reason": reason, "version": decision_version(p["window_end"], RECONCILE_RANK), "basis": Basis.FINAL,
            "broker_limits": None if final_qps is None else final_split,
        })
    return out


def state_after(saved: dict[Key, dict], folded: dict[Key, dict]) -> dict[Key, dict]:
    """The policy state per resource after a fold: the fold's state rows where it ran, else the saved rows."""
    return {**saved, **folded}

