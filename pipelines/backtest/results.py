"""The closed-loop backtest's lake side: ``gold/limits`` read back, the figures appended to ``backtest/results``."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd

from pipelines import schemas, tables
from pipelines.sim.figures import Figures

RESULTS_TABLE = tables.BACKTEST_RESULTS
GOVERNOR = "closed-loop"


def read_limits(lake) -> pd.DataFrame:
    """``gold/limits`` as pandas (timestamps UTC-aware); empty with the table's columns when absent."""
    frame = lake.read(tables.GOLD_LIMITS).toPandas()
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]) and frame[column].dt.tz is None:
            frame[column] = frame[column].dt.tz_localize("UTC")
    return frame


def write_results(lake, result, figures: Figures, run_id: str, recorded_at: dt.datetime) -> str:
    """Append the figures to ``backtest/results`` (:data:`pipelines.schemas.BACKTEST_RESULTS`) as one commit tagged
    with the transaction ``(backtest-<run_id>, 0)`` (a retried write adds nothing); NaN is stored as null."""
    rows = [(recorded_at, run_id, result.spec.name, result.spec.seed, GOVERNOR, cls, name,
             float(v) if np.isfinite(v) else None, unit)
            for name, (v, unit, cls) in figures.values.items()]
    df = lake.spark.createDataFrame(rows, schema=schemas.BACKTEST_RESULTS)
    lake.append(df, RESULTS_TABLE, app_id=f"backtest-{run_id}", version=0)
    return lake.path(RESULTS_TABLE)
