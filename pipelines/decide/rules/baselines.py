"""A resource's baseline: the quantile of its values over its previous windows (a surge's put rate, a group's consume
rate), and the surge rule's cheap gate on it. Used by the rules of both paths (:mod:`pipelines.decide.rules.anomalies`,
:mod:`pipelines.decide.rules.preliminary`).

Frames are polars DataFrames; times are UTC; values are msg/s.
"""

from __future__ import annotations

import datetime as dt
import math

import polars as pl

from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.arrow import micros, when
from pipelines.decide.rules.facts import surge_fires


def baselines(values: pl.DataFrame, key: str, first_window: dt.datetime, windows: WindowsConfig,
              cfg: DetectionConfig, at_least: float | None = None) -> pl.DataFrame:
    """Rows ``window_start``, ``key``, ``value`` (history and current windows together) → for each row whose window
    starts at or after ``first_window`` (and whose value is ``at_least``, when given: the surge floor, under which a
    row cannot fire, so only the resources at it pay for a baseline, about 2 % of a large cluster's topics):
    ``baseline_tps``, the ``baseline_quantile`` of the resource's values in the previous ``baseline_windows``
    windows by time (``[start - span, start - 1 s]``, every value, under the floor too), and ``baseline_windows``,
    how many values it saw (null baseline when none).

    The quantile is Spark's ``percentile_approx`` (accuracy 10,000) on at most thousands of values: the value at
    rank ``ceil(q × n)`` of the sorted values (``QuantileSummaries.query`` keeps every sample below its
    compression threshold)."""
    span = cfg.baseline_windows * windows.length_seconds
    q = cfg.baseline_quantile
    lazy = values.lazy().with_columns(pl.col("window_start").dt.epoch("s").alias("_s"))
    current = lazy.filter(when("window_start") >= micros(first_window))
    if at_least is not None:
        current = current.filter((pl.col("demand") if "demand" in values.columns else pl.col("value")) >= at_least)
    current = current.select("window_start", key, "_s").unique()
    frame = current.join(lazy.filter(pl.col("value").is_not_null()).select(key, pl.col("_s").alias("_h"), "value"),
                         on=key, how="inner").filter(
        (pl.col("_h") >= pl.col("_s") - span) & (pl.col("_h") <= pl.col("_s") - 1))
    stats = frame.group_by(["window_start", key]).agg(pl.col("value").sort().alias("_v"),
                                                      pl.len().alias("baseline_windows"))
    stats = stats.with_columns(
        pl.col("_v").list.get((pl.col("baseline_windows").cast(pl.Float64) * q).ceil().cast(pl.Int64) - 1)
        .alias("baseline_tps")).drop("_v")
    return current.join(stats, on=["window_start", key], how="left").with_columns(
        pl.col("baseline_windows").fill_null(0).cast(pl.Int32)).drop("_s").collect()


def surge_values(history: pl.DataFrame, current: pl.DataFrame, key: str, value: pl.Expr,
                 current_value: pl.Expr | None = None, reach: pl.Expr | None = None) -> pl.DataFrame:
    """History and current rows → ``window_start``, ``key``, ``value`` (the baselines' values: the surge rule's put
    rate; of a current row ``current_value`` when given: null where the window shows no demand, as its history row
    will be left out) and ``demand`` (what the rule judges: the put rate, a current row's whatever it shows, or
    ``reach`` when given: the most the rule may read of it, its puts read through the brokers it crowds)."""
    def cols(f, based, judged=value):
        return f.select(pl.col("window_start"), pl.col(key), based.alias("value"), judged.alias("demand"))

    parts = [cols(history, value)] if history.height else []
    if current.height:
        parts.append(cols(current, current_value if current_value is not None else value,
                          reach if reach is not None else value))
    return pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame(
        schema={"window_start": pl.Datetime("us", "UTC"), key: pl.String, "value": pl.Float64,
                "demand": pl.Float64})


def surge_may_fire(values: dict[str, list[tuple]], history: pl.DataFrame, key: str, value: pl.Expr,
                   cfg: DetectionConfig, cache: dict | None = None, where: pl.Expr | None = None) -> bool:
    """Whether ``TRAFFIC_SURGE`` can fire on a window of ``values`` (resource → (window_start, msg/s judged[, msg/s
    of its baseline value]) of the windows judged now): :func:`pipelines.decide.rules.facts.surge_fires` against a lower
    bound of its baseline. The
    baseline (:func:`baselines`) is the value at rank ``k = ceil(q × n) − 1`` of the n ≥
    ``baseline_min_windows`` values of the windows before it: of the ``history`` (the rule's ``value`` there) and of
    the windows judged now that start before it (``o`` of them). Removing those ``o`` lowers a rank by at most ``o``,
    more history (windows before the baseline's span) only lowers the values at each rank, and ``k`` grows with
    ``n``: so the history's value at rank ``ceil(q × baseline_min_windows) − 1 − o`` is a lower bound (else the
    smallest value of all). One polars operation (the history's lowest values and count per hot resource), none
    without a window at the floor, none when ``cache`` (a dict the caller keeps while it passes the same
    ``history`` frame) already holds them. ``where``: the history rows to read (default all)."""
    floor = cfg.surge_floor_tps
    values = {k: [(w[0], w[1], w[-1]) for w in v] for k, v in values.items()}  # (start, judged, baseline value)
    hot = {k: v for k, v in values.items() if max(x for _, x, _b in v) >= floor}
    if not hot:
        return False
    rank = max(math.ceil(cfg.baseline_quantile * cfg.baseline_min_windows) - 1, 0)
    kept = cache.get((key, rank)) if cache is not None else None
    bounds = kept[1] if kept is not None and kept[0] is history else {}
    missing = [k for k in hot if k not in bounds]
    if missing:
        rows = pl.col(key).is_in(missing) if where is None else pl.col(key).is_in(missing) & where
        known = history.lazy().filter(rows).group_by(key).agg(
            value.drop_nulls().sort().head(rank + 1).alias("low"), value.drop_nulls().len().alias("n")).collect() \
            if history.height else None
        found = {r[key]: (r["low"], r["n"]) for r in known.iter_rows(named=True)} if known is not None else {}
        bounds = {**bounds, **{k: found.get(k, ([], 0)) for k in missing}}
        if cache is not None:
            cache[(key, rank)] = (history, bounds)
    for k, windows in hot.items():
        lowest, n = bounds.get(k, ([], 0))
        for start, x, b in windows:
            before = [y for s, _x, y in windows if s < start and y is not None]
            if n + len(before) < cfg.baseline_min_windows:
                continue
            j = rank - len(before)
            bound = lowest[j] if 0 <= j < len(lowest) else min(lowest[:1] + before)
            if surge_fires(x, bound, cfg, busy=b is None):  # a topic's window refused as busy has no baseline value
                return True
    return False
