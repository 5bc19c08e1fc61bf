"""The per-resource policy fold (:func:`pipelines.transforms.fold.fold_resource`), run on the driver over the
micro-batch's small input.

No built-in Spark function folds a sequence of windows with carried state (the current limit, its version, when
the anomaly was last seen), so the fold is plain Python, once per resource. Its input is small: only resources with
a candidate in this micro-batch or a limit in force (a few rows per such resource and window; a storm over 10,000
topics would be 10,000 groups of a few rows, well within one driver). So the input is collected through Arrow and
folded on the driver, and the result becomes a local DataFrame again.
"""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.spark_compat import arrow_schema
from pipelines.config import LimitsConfig
from pipelines.transforms.fold import Candidate, Observation, ResourceState, fold_resource

FOLD_COLUMNS = [field.name for field in schemas.POLICY_FOLD.fields]
#: Explicit column types of the fold's output, so that an all-null column still reaches Arrow with its type.
PANDAS_DTYPES = {
    f.name: {"timestamp": "datetime64[ns]", "double": "float64", "long": "Int64", "boolean": "boolean"}.get(
        f.dataType.typeName(), "object"
    )
    for f in schemas.POLICY_FOLD.fields
}
FOLD_ARROW_SCHEMA = arrow_schema(schemas.POLICY_FOLD)
#: The state columns of POLICY_FOLD (and POLICY_STATE) besides the resource keys, with the ResourceState field each
#: one holds.
STATE_COLUMNS = ("limit_qps", "version", "last_candidate_end", "last_decision_end", "last_change_end",
                 "lift_at_qps", "mode", "target_qps", "limited_since", "broker_shares", "last_distress_end",
                 "last_lift_end", "lifted_target_qps", "recurrences")
#: Row kinds of POLICY_FOLD.
CANDIDATE, OBSERVATION, STATE, DECISION, EVIDENCE = "candidate", "observation", "state", "decision", "evidence"


def _ts(value: object) -> dt.datetime | None:
    """A naive UTC datetime (as Spark collects timestamps in a UTC session), from Arrow's UTC-aware values too."""
    if value is None or (not isinstance(value, (list, dict)) and pd.isna(value)):
        return None
    stamp = pd.Timestamp(value)
    if stamp.tzinfo is not None:
        stamp = stamp.tz_convert("UTC").tz_localize(None)
    return stamp.to_pydatetime()


def _num(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _figures(value: object) -> dict[str, float]:
    """A map column as Arrow hands it to pandas (a list of (key, value) pairs, or None) → a dict."""
    if value is None or isinstance(value, float):
        return {}
    pairs = value.items() if isinstance(value, dict) else value
    return {str(k): float(v) for k, v in pairs if v is not None}


def _saved_state(rows: pd.DataFrame) -> ResourceState:
    first = rows.iloc[0]
    state = ResourceState(str(first["resource_type"]), str(first["resource"]))
    saved = rows[rows["row_kind"] == STATE]
    if not len(saved):
        return state
    s = saved.iloc[0]
    return ResourceState(
        state.resource_type,
        state.resource,
        limit_qps=_num(s["limit_qps"]),
        version=int(s["version"]) if not pd.isna(s["version"]) else 0,
        last_candidate_end=_ts(s["last_candidate_end"]),
        last_decision_end=_ts(s["last_decision_end"]),
        last_change_end=_ts(s["last_change_end"]),
        lift_at_qps=_num(s["lift_at_qps"]),
        mode=str(s["mode"]) if isinstance(s["mode"], str) else "enforce",
        target_qps=_num(s["target_qps"]),
        limited_since=_ts(s["limited_since"]),
        broker_shares=_figures(s["broker_shares"]),
        last_distress_end=_ts(s["last_distress_end"]),
        last_lift_end=_ts(s["last_lift_end"]),
        lifted_target_qps=_num(s["lifted_target_qps"]),
        recurrences=0 if pd.isna(s["recurrences"]) else int(s["recurrences"]),
    )


def _fold_group(rows: pd.DataFrame, horizon_end: dt.datetime, cfg: LimitsConfig, window_seconds: int,
                recover: bool = True) -> pd.DataFrame:
    cands = [
        Candidate(
            _ts(r.window_end), float(r.target_qps), str(r.reason), _num(r.floor_qps) or 0.0,  # type: ignore[arg-type]
            _num(r.lift_at_qps), _num(r.observed_tps), bool(r.critical), str(r.mode), _figures(r.broker_tps),
        )
        for r in rows[rows["row_kind"] == CANDIDATE].itertuples()
    ]
    obs = [
        Observation(_ts(r.window_end), _num(r.observed_tps) or 0.0,  # type: ignore[arg-type]
                    0 if pd.isna(r.rejected) else int(r.rejected), bool(r.healthy) if not pd.isna(r.healthy) else True)
        for r in rows[rows["row_kind"] == OBSERVATION].itertuples()
    ]
    decisions, final, evidence = fold_resource(_saved_state(rows), cands, horizon_end, cfg, window_seconds, recover,
                                               observations=obs)
    keys = {"resource_type": final.resource_type, "resource": final.resource}
    out = [
        {"row_kind": DECISION, **keys, "window_end": d.window_end, "limit_qps": d.limit_qps,
         "previous_qps": d.previous_qps, "action": d.action, "mode": d.mode, "reason": d.reason, "version": d.version,
         "broker_limits": sorted(d.broker_limits.items()) or None}
        for d in decisions
    ]
    out += [
        {"row_kind": EVIDENCE, **keys, "window_end": e.window_end, "status": e.status, "limit_qps": e.limit_qps,
         "observed_tps": e.observed_tps, "rejected": e.rejected, "reason": e.detail, "rule_fired": e.rule_fired}
        for e in evidence
    ]
    state = {name: getattr(final, name) for name in STATE_COLUMNS}
    state["broker_shares"] = sorted(final.broker_shares.items()) or None
    out.append({"row_kind": STATE, **keys, **state})
    return pd.DataFrame(out, columns=FOLD_COLUMNS).astype(PANDAS_DTYPES)


def _aligned(df: DataFrame) -> DataFrame:
    return df.select(*[
        (F.col(f.name) if f.name in df.columns else F.lit(None)).cast(f.dataType).alias(f.name)
        for f in schemas.POLICY_FOLD.fields
    ])


def fold_input(candidates: DataFrame, state: DataFrame, observations: DataFrame | None = None) -> DataFrame:
    """The fold's input: :data:`pipelines.schemas.POLICY_FOLD` rows: ``candidate`` rows, ``observation`` rows
    (:func:`pipelines.transforms.demand.observations`) and the saved ``state`` rows of resources with a limit in
    force or with a candidate now (their version counter continues)."""
    cand_rows = candidates.select(F.lit(CANDIDATE).alias("row_kind"), *candidates.columns)
    touched = candidates.select("resource_type", "resource").distinct()
    relevant = state.where(F.col("limit_qps").isNotNull()).unionByName(
        state.where(F.col("limit_qps").isNull()).join(touched, ["resource_type", "resource"], "left_semi")
    )
    state_rows = relevant.select(F.lit(STATE).alias("row_kind"), "resource_type", "resource", *STATE_COLUMNS)
    parts = [_aligned(cand_rows), _aligned(state_rows)]
    if observations is not None:
        parts.append(_aligned(observations.select(F.lit(OBSERVATION).alias("row_kind"), *observations.columns)))
    return parts[0].unionByName(parts[1]).unionByName(parts[2]) if len(parts) == 3 else parts[0].unionByName(parts[1])


def decide(
    candidates: DataFrame,
    state: DataFrame,
    horizon_end: dt.datetime,
    cfg: LimitsConfig,
    window_seconds: int,
    recover: bool = True,
    observations: DataFrame | None = None,
) -> DataFrame:
    """Run the policy fold for every resource with a candidate or an active limit (``recover``: see
    :func:`pipelines.transforms.fold.fold_resource`).

    Args:
        candidates: :func:`pipelines.transforms.policy.candidate_limits` rows, with ``broker_tps`` when known
            (:func:`pipelines.transforms.demand.with_broker_tps`).
        state: saved state rows (:data:`pipelines.schemas.POLICY_STATE` without ``batch_id``), one per resource.
        horizon_end: end of the last finalized window of the micro-batch (UTC).
        observations: the demand evidence of the micro-batch's windows (final path), None on the fast path.
    Returns:
        :data:`pipelines.schemas.POLICY_FOLD` rows (a local DataFrame): ``decision`` rows, ``evidence`` rows (the
        windows under an enforced limit) and one ``state`` row per resource, resources in (resource_type, resource)
        order.
    """
    rows = fold_input(candidates, state, observations).toArrow().to_pandas()
    # a resource that is only observed (neither limited nor a candidate) has nothing to fold
    anchored = rows.loc[rows["row_kind"].isin([CANDIDATE, STATE]), ["resource_type", "resource"]].drop_duplicates()
    rows = rows.merge(anchored, on=["resource_type", "resource"], how="inner")
    folded = [
        _fold_group(group, horizon_end, cfg, window_seconds, recover)
        for _, group in rows.groupby(["resource_type", "resource"], sort=True)
    ]
    out = pd.concat(folded, ignore_index=True) if folded else pd.DataFrame(columns=FOLD_COLUMNS).astype(PANDAS_DTYPES)
    table = pa.Table.from_pandas(out, schema=FOLD_ARROW_SCHEMA, preserve_index=False)
    return candidates.sparkSession.createDataFrame(table, schema=schemas.POLICY_FOLD)
