"""The per-resource policy fold as a grouped pandas UDF (``applyInPandas``).

No built-in Spark function folds a sequence of windows with carried state (the current limit, its version, when
the anomaly was last seen), so the fold is plain Python (:func:`pipelines.policy.fold_resource`) run once per
resource on the executors. Its input is small: only resources with a candidate in this micro-batch or a limit in
force.
"""

from __future__ import annotations

import datetime as dt

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.config import LimitsConfig
from pipelines.policy import Candidate, ResourceState, fold_resource

FOLD_COLUMNS = [field.name for field in schemas.POLICY_FOLD.fields]


def _ts(value: object) -> dt.datetime | None:
    return None if value is None or pd.isna(value) else pd.Timestamp(value).to_pydatetime()


def _fold_group(
    rows: pd.DataFrame, horizon_end: dt.datetime, cfg: LimitsConfig, window_seconds: int
) -> pd.DataFrame:
    first = rows.iloc[0]
    state = ResourceState(str(first["resource_type"]), str(first["resource"]))
    saved = rows[rows["row_kind"] == "state"]
    if len(saved):
        s = saved.iloc[0]
        state = ResourceState(
            state.resource_type,
            state.resource,
            None if pd.isna(s["limit_qps"]) else float(s["limit_qps"]),
            int(s["version"]),
            _ts(s["last_candidate_end"]),
            _ts(s["last_decision_end"]),
        )
    cands = [
        Candidate(_ts(r.window_end), float(r.target_qps), str(r.reason))  # type: ignore[arg-type]
        for r in rows[rows["row_kind"] == "candidate"].itertuples()
    ]
    decisions, final = fold_resource(state, cands, horizon_end, cfg, window_seconds)
    out = [
        {
            "row_kind": "decision",
            "resource_type": d.resource_type,
            "resource": d.resource,
            "window_end": d.window_end,
            "limit_qps": d.limit_qps,
            "previous_qps": d.previous_qps,
            "action": d.action,
            "reason": d.reason,
            "version": d.version,
        }
        for d in decisions
    ]
    out.append(
        {
            "row_kind": "state",
            "resource_type": final.resource_type,
            "resource": final.resource,
            "limit_qps": final.limit_qps,
            "version": final.version,
            "last_candidate_end": final.last_candidate_end,
            "last_decision_end": final.last_decision_end,
        }
    )
    return pd.DataFrame(out, columns=FOLD_COLUMNS)


def decide(
    candidates: DataFrame,
    state: DataFrame,
    horizon_end: dt.datetime,
    cfg: LimitsConfig,
    window_seconds: int,
) -> DataFrame:
    """Run the policy fold for every resource with a candidate or an active limit.

    Args:
        candidates: :func:`pipelines.policy.candidate_limits` rows.
        state: saved state rows (:data:`pipelines.schemas.POLICY_STATE`), one per resource.
        horizon_end: end of the last finalized window of the micro-batch (UTC).
    Returns:
        :data:`pipelines.schemas.POLICY_FOLD` rows: ``decision`` rows and one ``state`` row per resource.
    """
    active_state = state.where(F.col("limit_qps").isNotNull())
    cand_rows = candidates.select(
        F.lit("candidate").alias("row_kind"), "resource_type", "resource", "window_end", "target_qps", "reason"
    )
    state_rows = active_state.select(
        F.lit("state").alias("row_kind"),
        "resource_type",
        "resource",
        "limit_qps",
        "version",
        "last_candidate_end",
        "last_decision_end",
    )
    touched = cand_rows.select("resource_type", "resource").union(state_rows.select("resource_type", "resource"))
    # resources with a candidate but a lifted (inactive) saved state still need their version counter
    inactive = state.where(F.col("limit_qps").isNull()).join(touched.distinct(), ["resource_type", "resource"], "left_semi")
    all_state = state_rows.unionByName(
        inactive.select(
            F.lit("state").alias("row_kind"),
            "resource_type",
            "resource",
            "limit_qps",
            "version",
            "last_candidate_end",
            "last_decision_end",
        )
    )
    rows = cand_rows.unionByName(all_state, allowMissingColumns=True)
    schema = schemas.POLICY_FOLD
    return rows.select(*[F.col(f.name).cast(f.dataType) if f.name in rows.columns else F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields]).groupBy(
        "resource_type", "resource"
    ).applyInPandas(lambda pdf: _fold_group(pdf, horizon_end, cfg, window_seconds), schema=schema)
