"""Preliminary → final reconciliation: the one owner of how the two speeds' decisions meet.

The fast path decides on open windows (basis ``preliminary``), the final path on finalized ones (basis ``final``);
this module owns every rule between them:

* **Versions** (:func:`decision_version`, :data:`VERSION_RANK`, :data:`RECONCILE_RANK`): a decision's ``version`` is
  ``unix seconds of window_end × 10 + rank``, so a window's final decision (rank 5) and the final path's answer to a
  preliminary one (rank 6) outrank the preliminary decision of the same window (rank 1), across restarts and lakes.
* **The fast path's starting point** (:func:`preliminary_state`): the final path's saved state with the newer
  preliminary limit in force (its target and per-broker shares frozen as the final path will freeze them).
* **The final path's answer** (:func:`reconcile_preliminary`): confirm (no row), correct (``set``) or reverse
  (``lift``) each preliminary ``set`` of a window that is now final; :func:`state_after` is the policy state after a
  fold, the input of that answer.
* **Which decision is in force**: the newest row per resource by ``version`` (``pipelines.io.publish
  .latest_per_resource``, over the lake's delta-rs snapshot ``pipelines.io.lake.Lake.latest_rows``), read by both
  flows (``pipelines.flows.base.DecisionFlow.latest_limits``) and by every publish.

Pure ``DataFrame -> DataFrame`` functions and Column builders; docs/contracts.md §2 (``gold/limits``) describes the
columns.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines.config import GovernorConfig
from pipelines.transforms.fold import ACTION_LIFT, ACTION_SET, ANY_BROKER, BASIS_FINAL, BASIS_PRELIMINARY

#: Last digit of a decision's ``version`` by basis: the final decision (or the reversal) of a window outranks
#: the preliminary decision of the same window (see :func:`decision_version`).
VERSION_RANK = {BASIS_PRELIMINARY: 1, BASIS_FINAL: 5}
#: Rank of the final path's confirmation or reversal of a preliminary decision.
RECONCILE_RANK = 6


def decision_version(window_end: Column, rank: Column | int) -> Column:
    """The ``version`` of a decision: ``unix seconds of window_end × 10 + rank`` (:data:`VERSION_RANK`).

    Built from event time, versions grow per resource across restarts and across lakes (a new lake after a
    checkpoint change continues above the old one), so brokers that refuse a stale version (``control/applier.py``)
    keep accepting a new governor's records; a window's final decision outranks its preliminary one.
    """
    rank_col = rank if isinstance(rank, Column) else F.lit(rank)
    return (F.unix_timestamp(window_end).cast("long") * 10 + rank_col).cast("long")


def preliminary_state(saved_state: DataFrame, latest_limits: DataFrame) -> DataFrame:
    """The state the fast path folds from: the final path's saved state, with the limit of a newer preliminary
    decision in force (so a preliminary limit is not decided again every micro-batch; hysteresis, cool-down and
    the maximum cut apply from it). A preliminary limit the final path has not folded yet also freezes its target
    and its per-broker shares (from its ``broker_limits``), as the final path will. Columns of POLICY_STATE
    without ``batch_id``."""
    keys = ["resource_type", "resource"]
    prelim = latest_limits.where(F.col("basis") == BASIS_PRELIMINARY).select(
        *keys,
        F.when(F.col("action") != ACTION_LIFT, F.col("limit_qps")).alias("p_limit"),
        F.col("window_end").alias("p_end"),
        F.col("mode").alias("p_mode"),
        F.map_filter("broker_limits", lambda b, _: b != F.lit(ANY_BROKER)).alias("p_split"),
    )
    joined = saved_state.join(prelim, keys, "full")
    has_prelim = F.col("p_end").isNotNull()
    over = lambda name, value: F.when(has_prelim, value).otherwise(F.col(name)).alias(name)  # noqa: E731
    first = has_prelim & F.col("limit_qps").isNull()  # a limit only the fast path has decided so far
    p_shares = F.transform_values("p_split", lambda _, q: q / F.col("p_limit"))
    keep_or = lambda name, value: F.when(first, value).otherwise(F.col(name)).alias(name)  # noqa: E731
    return joined.select(
        *keys,
        over("limit_qps", F.col("p_limit")),
        F.coalesce(F.col("version"), F.lit(0).cast("long")).alias("version"),
        F.col("last_candidate_end"),
        over("last_decision_end", F.col("p_end")),
        over("last_change_end", F.col("p_end")),
        F.col("lift_at_qps"),
        over("mode", F.col("p_mode")),
        keep_or("target_qps", F.col("p_limit")),
        keep_or("limited_since", F.col("p_end")),
        keep_or("broker_shares", p_shares),
        F.col("last_distress_end"),
        F.col("last_lift_end"),
        F.col("lifted_target_qps"),
        F.col("recurrences"),
        *[F.col(name) for name in ("baseline_tps", "busy_load", "probe_from_qps", "probe_ceiling_qps",
                                   "probe_hold_until", "probe_backoff", "cause_changes")],
    )


def reconcile_preliminary(
    latest_limits: DataFrame,
    final_limits: DataFrame,
    final_state: DataFrame,
    horizon_end: dt.datetime,
    cfg: GovernorConfig,
    now: dt.datetime,
) -> DataFrame:
    """The final path's answer to preliminary decisions on windows that are now final → ``gold/limits`` rows.

    For each resource whose newest decision is a preliminary ``set`` of a window ending at or before
    ``horizon_end`` (UTC) and that this batch did not decide again (no final row of that window or later):

    * the final policy state has no limit for it (the final window did not confirm the anomaly) → ``lift``:
      the preliminary limit is reversed, with its own reason;
    * the final state's limit differs → ``set`` to the final limit (the partial evidence gave another number);
    * the same limit → confirmed, no row.

    Rows are basis ``final``, ``version`` :func:`decision_version` of the preliminary
    window with rank :data:`~pipelines.transforms.RECONCILE_RANK` (above the window's preliminary version).

    Args:
        final_state: POLICY_STATE rows (without ``batch_id``) after this batch's fold, one per resource.
    """
    from pipelines.transforms.policy import burst_for  # the policy's own rule; policy imports this module

    keys = ["resource_type", "resource"]
    prelim = latest_limits.where(
        (F.col("basis") == BASIS_PRELIMINARY) & (F.col("action") == ACTION_SET)
        & (F.col("window_end") <= F.lit(horizon_end))
    )
    decided_again = prelim.alias("p").join(
        final_limits.alias("f"),
        (F.col("p.resource_type") == F.col("f.resource_type")) & (F.col("p.resource") == F.col("f.resource"))
        & (F.col("f.window_end") >= F.col("p.window_end")),
        "left_semi",
    )
    pending = prelim.join(decided_again.select(*keys), keys, "left_anti")
    joined = pending.join(final_state.select(*keys, F.col("limit_qps").alias("final_qps"),
                                             F.col("broker_shares").alias("final_shares")), keys, "left")
    final_qps = F.col("final_qps")
    final_split = _split(final_qps, F.col("final_shares"))
    split_differs = ~F.coalesce(_same_figures(F.col("broker_limits"), final_split), F.lit(False))
    differs = final_qps.isNull() | (F.abs(final_qps - F.col("limit_qps")) > F.lit(1e-9) * F.abs(final_qps)) \
        | split_differs
    window_text = F.date_format(F.col("window_end"), "yyyy-MM-dd'T'HH:mm:ss'Z'")
    lifted = final_qps.isNull()
    reason = F.when(
        lifted,
        F.format_string("[final] the final window ending %s did not confirm the preliminary limit of %.1f msg/s; "
                        "reversed, brokers fall back to their defaults", window_text, F.col("limit_qps")),
    ).otherwise(
        F.format_string("[final] the final window ending %s sets %.1f msg/s where the preliminary decision on "
                        "partial evidence set %.1f msg/s", window_text, final_qps, F.col("limit_qps")),
    )
    limit = F.when(lifted, F.col("limit_qps")).otherwise(final_qps)
    decided = F.lit(now).cast("timestamp")
    reason = F.when(~lifted & split_differs & (F.abs(final_qps - F.col("limit_qps")) <= F.lit(1e-9) * F.abs(final_qps)),
                    F.format_string("[final] the final window ending %s splits the %.1f msg/s limit over its brokers by "
                                    "their complete traffic (the preliminary split saw part of the window)",
                                    window_text, final_qps)).otherwise(reason)
    return joined.where(differs).select(
        decided.alias("decided_at"),
        F.col("window_end"),
        *keys,
        limit.alias("limit_qps"),
        burst_for(limit, cfg.limits).alias("burst"),
        F.col("limit_qps").alias("previous_qps"),
        F.when(lifted, F.lit(ACTION_LIFT)).otherwise(F.lit(ACTION_SET)).alias("action"),
        F.col("mode"),
        (decided + F.make_dt_interval(secs=F.lit(cfg.limits.ttl_seconds))).alias("expires_at"),
        reason.alias("reason"),
        decision_version(F.col("window_end"), RECONCILE_RANK).alias("version"),
        F.lit(BASIS_FINAL).alias("basis"),
        F.when(~lifted, final_split).alias("broker_limits"),
    )


def _split(limit: Column, shares: Column) -> Column:
    """A limit split by frozen shares, as :func:`pipelines.transforms.fold.broker_limits` does (the ``"*"`` entry
    at the smallest share); null without shares."""
    split = F.transform_values(shares, lambda _, share: limit * share)
    with_any = F.map_concat(split, F.create_map(F.lit(ANY_BROKER), F.array_min(F.map_values(split))))
    return F.when(F.size(shares) > 0, with_any)


def _same_figures(a: Column, b: Column) -> Column:
    """Two per-broker maps with the same brokers and figures within 1e-9 relative (null = no split)."""
    both_null = a.isNull() & b.isNull()
    keys_equal = F.array_sort(F.map_keys(a)) == F.array_sort(F.map_keys(b))
    close = F.forall(F.map_keys(a), lambda k: F.abs(a[k] - b[k]) <= F.lit(1e-9) * F.abs(b[k]))
    return both_null | (a.isNotNull() & b.isNotNull() & keys_equal & close)


def state_after(saved: DataFrame, folded_state: DataFrame) -> DataFrame:
    """The policy state per resource after a fold: the fold's state rows where it ran, else the saved rows."""
    keys = ["resource_type", "resource"]
    untouched = saved.join(folded_state.select(*keys), keys, "left_anti")
    return folded_state.select(*saved.columns).unionByName(untouched)
