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
import logging

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.spark_compat import arrow_schema
from pipelines.config import DetectionConfig, LimitsConfig
from pipelines.transforms.fold import VETO, Candidate, Observation, ResourceState, fold_resource

#: Open-window evidence per resource for the final path's lift veto: (resource_type, resource) → observations of the
#: fast path's open windows (:func:`pipelines.transforms.fold.fold_resource`'s ``open_evidence``).
OpenEvidence = dict[tuple[str, str], list[Observation]]

log = logging.getLogger("rate_governor")

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
                 "last_lift_end", "lifted_target_qps", "recurrences", "baseline_tps", "busy_load", "probe_from_qps",
                 "probe_ceiling_qps", "probe_hold_until", "probe_backoff", "cause_changes")
#: Map columns of STATE_COLUMNS (dicts in ResourceState, sorted (key, value) pairs in Arrow).
STATE_MAPS = ("broker_shares", "busy_load")
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


def _int(value: object) -> int:
    return 0 if value is None or pd.isna(value) else int(value)


def _names(value: object) -> tuple[str, ...]:
    """An array column as Arrow hands it to pandas (an ndarray or list, or None) → a tuple of names."""
    if value is None or isinstance(value, float):
        return ()
    return tuple(str(v) for v in value)


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
        version=_int(s["version"]),
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
        recurrences=_int(s["recurrences"]),
        baseline_tps=_num(s["baseline_tps"]),
        busy_load=_figures(s["busy_load"]),
        probe_from_qps=_num(s["probe_from_qps"]),
        probe_ceiling_qps=_num(s["probe_ceiling_qps"]),
        probe_hold_until=_ts(s["probe_hold_until"]),
        probe_backoff=_int(s["probe_backoff"]),
        cause_changes=_int(s["cause_changes"]),
    )


def _observation(r) -> Observation:
    return Observation(_ts(r.window_end), _num(r.observed_tps) or 0.0,  # type: ignore[arg-type]
                       0 if pd.isna(r.rejected) else int(r.rejected),
                       bool(r.healthy) if not pd.isna(r.healthy) else True, _num(r.consume_tps),
                       _figures(r.carrier_load), _names(r.busy_brokers))


def _fold_group(rows: pd.DataFrame, horizon_end: dt.datetime, cfg: LimitsConfig, window_seconds: int,
                recover: bool = True, detection: DetectionConfig | None = None,
                open_evidence: list[Observation] | None = None) -> pd.DataFrame:
    cands = [
        Candidate(
            _ts(r.window_end), float(r.target_qps), str(r.reason), _num(r.floor_qps) or 0.0,  # type: ignore[arg-type]
            _num(r.lift_at_qps), _num(r.observed_tps), bool(r.critical), str(r.mode), _figures(r.broker_tps),
            _num(r.baseline_tps),
        )
        for r in rows[rows["row_kind"] == CANDIDATE].itertuples()
    ]
    obs = [_observation(r) for r in rows[rows["row_kind"] == OBSERVATION].itertuples()]
    decisions, final, evidence = fold_resource(_saved_state(rows), cands, horizon_end, cfg, window_seconds, recover,
                                               observations=obs, detection=detection,
                                               open_evidence=open_evidence or ())
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
    for name in STATE_MAPS:
        state[name] = sorted(state[name].items()) or None
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
    detection: DetectionConfig | None = None,
    open_evidence: OpenEvidence | None = None,
) -> DataFrame:
    """Run the policy fold for every resource with a candidate or an active limit (``recover``: see
    :func:`pipelines.transforms.fold.fold_resource`).

    Args:
        candidates: :func:`pipelines.transforms.policy.candidate_limits` rows, with ``broker_tps`` when known
            (:func:`pipelines.transforms.demand.with_broker_tps`).
        state: saved state rows (:data:`pipelines.schemas.POLICY_STATE` without ``batch_id``), one per resource.
        horizon_end: end of the last finalized window of the micro-batch (UTC).
        observations: the demand evidence of the micro-batch's windows (final path), None on the fast path.
        detection: the rules' thresholds (a limited resource is judged by its rule on the visible demand).
        open_evidence: the fast path's open windows of resources under a limit (the final path's lift veto).
    Returns:
        :data:`pipelines.schemas.POLICY_FOLD` rows (a local DataFrame): ``decision`` rows, ``evidence`` rows (the
        windows under an enforced limit) and one ``state`` row per resource, resources in (resource_type, resource)
        order.
    """
    rows = fold_input(candidates, state, observations).toArrow().to_pandas()
    # a resource that is only observed (neither limited nor a candidate) has nothing to fold
    anchored = rows.loc[rows["row_kind"].isin([CANDIDATE, STATE]), ["resource_type", "resource"]].drop_duplicates()
    rows = rows.merge(anchored, on=["resource_type", "resource"], how="inner")
    opened = open_evidence or {}
    folded = [
        _fold_group(group, horizon_end, cfg, window_seconds, recover, detection, opened.get(key))
        for key, group in rows.groupby(["resource_type", "resource"], sort=True)
    ]
    out = pd.concat(folded, ignore_index=True) if folded else pd.DataFrame(columns=FOLD_COLUMNS).astype(PANDAS_DTYPES)
    for veto in out[(out["row_kind"] == EVIDENCE) & (out["status"] == VETO)].itertuples():
        log.info("%s %s: %s", veto.resource_type, veto.resource, veto.reason)
    table = pa.Table.from_pandas(out, schema=FOLD_ARROW_SCHEMA, preserve_index=False)
    return candidates.sparkSession.createDataFrame(table, schema=schemas.POLICY_FOLD)
