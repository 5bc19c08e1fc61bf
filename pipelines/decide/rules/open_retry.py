"""The fast path's reading of a consumer group's retry traffic on open windows (:func:`open_retry_traffic`): its
send-backs and fallback sends per broker, read through the share of sends each broker accepted, or through what
the group's fallback sends reveal (:func:`pipelines.decide.rules.facts.sendback_acceptance`) where that figure of all
its brokers is known (a window complete by census, or every earlier carrier heard: :func:`groups_heard`) and the
group is not under a limit (:func:`limited_groups`). The final windows' reading of the same:
:func:`pipelines.decide.rules.windows.resource_traffic`."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import polars as pl

from pipelines import rocketmq as rmq
from pipelines.decide.arrow import when
from pipelines.decide.rules.facts import (
    acceptance, newest_carriers, rate, retry_traffic, sendback_acceptance, through_busy,
)


def limited_groups(limited: Collection[str]) -> frozenset[str]:
    """``"<resource_type>\\x1f<resource>"`` keys of the resources under a limit (the final path's ``limited``,
    :func:`pipelines.decide.rules.windows.resource_traffic`) → the consumer groups among them."""
    return frozenset(name for kind, _sep, name in (key.partition("\x1f") for key in limited) if kind == "group")


def logged_puts(rows: Iterable[dict]) -> dict[tuple, float]:
    """Open-window rows (dicts) → per ``(window_start, broker)`` the puts whose refusals the producers log: the
    broker row's ``puts`` less the retry topics' (``%RETRY%<group>``, per broker from their ``broker_amounts``:
    consumers' send-backs and their clients' fallback sends, whose refusals leave no line), the numerator of
    :func:`~pipelines.decide.rules.facts.acceptance` as :func:`pipelines.decide.rules.windows.broker_acceptance` reads
    it on the final windows. A retry topic's row without ``broker_amounts`` (the gate's light rows,
    :data:`pipelines.decide.paths.fast.OpenRows.LIGHT`) counts its puts against every broker of its window: a lower
    bound of each broker's logged puts, so the gate (:func:`pipelines.decide.rules.preliminary.rules_that_may_fire`)
    reads at least the retry traffic the rule reads."""
    puts: dict[tuple, float] = {}
    unlogged: dict[tuple, float] = {}
    anywhere: dict = {}
    for r in rows:
        if r["resource_type"] == "broker":
            puts[(r["window_start"], r["resource"])] = r["puts"] or 0
        elif r["resource_type"] == "topic" and (r["resource"] or "").startswith(rmq.RETRY_TOPIC_PREFIX):
            if "broker_amounts" not in r:
                anywhere[r["window_start"]] = anywhere.get(r["window_start"], 0) + (r["puts"] or 0)
                continue
            for broker, amount in dict(r["broker_amounts"] or {}).items():
                unlogged[(r["window_start"], broker)] = unlogged.get((r["window_start"], broker), 0) + (amount or 0)
    return {k: max(v - unlogged.get(k, 0) - anywhere.get(k[0], 0), 0) for k, v in puts.items()}


def open_retry_traffic(open_rows: pl.DataFrame, windows: list[int], seconds: int,
                       complete: set | frozenset = frozenset(),
                       limited: set | frozenset = frozenset(),
                       heard: Mapping | None = None) -> dict[tuple, float]:
    """Open-window rows of the windows starting at ``windows`` (microseconds) → each group's retry traffic so far
    (``(window_start, group)`` → msg/s over windows of ``seconds``): per broker the
    :func:`~pipelines.decide.rules.facts.retry_traffic` of its send-backs and the plain sends to ``%RETRY%<group>``,
    summed over brokers (as :func:`pipelines.decide.rules.windows.per_broker_traffic` reads the final windows), each
    broker's read through the share of sends it accepted so far (:func:`~pipelines.decide.rules.facts.acceptance` of its
    puts and busy failures in the window, as :func:`pipelines.decide.rules.windows.broker_acceptance` reads the final
    windows; 1 for a broker without a row yet), or in a window complete by census (``complete``: its starts, as the rows
    have them) through the share its fallback sends reveal when smaller
    (:func:`~pipelines.decide.rules.facts.sendback_acceptance`: a figure of all the group's brokers, whose fallback
    sends go to any of them; read on some of them, a single broker's early line decides a limit whose unheard carriers
    get its whole figure, ``*``), except a group under a limit (``limited``: group names; its fallback sends count the
    limiter's refusals, and a preliminary decision on its newer open window would outrank the final path's on an older
    one, a squeeze say, by version). A window not complete by census reads them too for a group all of whose earlier
    carriers have reported in it (``heard``: window start → group names, :func:`groups_heard`; docs/decisions.md §8).
    Returns (that traffic, what the brokers admitted of it), both keyed alike."""
    in_windows = when("window_start").is_in(windows)
    rows = open_rows.filter(in_windows & (
        (pl.col("resource_type") == "group") | ((pl.col("resource_type") == "topic")
                                                & pl.col("resource").str.starts_with(rmq.RETRY_TOPIC_PREFIX))))
    current = open_rows.filter(in_windows & pl.col("resource_type").is_in(["broker", "topic"]))
    logged = logged_puts(current.select("window_start", "resource_type", "resource", "puts", "broker_amounts")
                         .iter_rows(named=True))
    accepted = {(r[0], r[1]): acceptance(logged[(r[0], r[1])], r[2] or 0) for r in current.filter(
        pl.col("resource_type") == "broker").select("window_start", "resource", "busy_failures").iter_rows()}
    sent: dict[tuple, dict] = {}
    sent_back: dict[tuple, float] = {}
    for r in rows.select("window_start", "resource_type", "resource", "broker_amounts").iter_rows(named=True):
        retry_topic = r["resource_type"] == "topic"
        group = r["resource"][len(rmq.RETRY_TOPIC_PREFIX):] if retry_topic else r["resource"]
        per_broker = sent.setdefault((r["window_start"], group), {})
        for broker, amount in (r["broker_amounts"] or {}).items():
            per_broker[broker] = retry_traffic(per_broker.get(broker, 0), amount or 0)
            if not retry_topic:
                sent_back[r["window_start"], group] = sent_back.get((r["window_start"], group), 0) + (amount or 0)
    def share(key, broker):
        accepted_there = accepted.get((key[0], broker), 1.0)
        if key[1] in limited or (key[0] not in complete and key[1] not in (heard or {}).get(key[0], ())):
            return accepted_there
        return sendback_acceptance(accepted_there, sum(sent[key].values()), sent_back.get(key, 0))

    traffic = {key: rate(sum(through_busy(x, share(key, b)) for b, x in amounts.items()), seconds)
               for key, amounts in sent.items()}
    return traffic, {key: rate(sum(amounts.values()), seconds) for key, amounts in sent.items()}


def groups_heard(open_rows: pl.DataFrame, earlier, reported: Mapping) -> dict:
    """Open-window rows and the earlier open-window rows the fast path remembers (``earlier``: Arrow or polars, the
    same columns; None: none) → per window of ``reported`` (its start, as the rows have them → the brokers its
    census row lists; windows not complete by census) the consumer groups all of whose carriers in the newest
    earlier window the fast path remembers (the brokers with send-backs or plain sends to ``%RETRY%<group>``
    there) have reported in it: the groups whose fallback sends :func:`open_retry_traffic` may read on that
    window, a figure of all their brokers that the brokers still to report are unlikely to change. A group seen
    nowhere earlier is not heard."""
    if earlier is None or not reported:
        return {}
    earlier = earlier if isinstance(earlier, pl.DataFrame) else pl.from_arrow(earlier)
    partial = list(reported)
    def retry_rows(frame):
        for r in frame.filter(((pl.col("resource_type") == "group") | (
                (pl.col("resource_type") == "topic") & pl.col("resource").str.starts_with(rmq.RETRY_TOPIC_PREFIX)))
        ).select("window_start", "resource_type", "resource", "broker_amounts").iter_rows(named=True):
            group = r["resource"][len(rmq.RETRY_TOPIC_PREFIX):] if r["resource_type"] == "topic" else r["resource"]
            yield r["window_start"], group, {b for b, v in (r["broker_amounts"] or {}).items() if v}
    carried: dict[str, dict] = {}
    for start, group, brokers in retry_rows(earlier):
        carried.setdefault(group, {}).setdefault(start, set()).update(brokers)
    out: dict = {}
    for start, group, _brokers in retry_rows(open_rows.filter(pl.col("window_start").is_in(partial))):
        last = newest_carriers(carried.get(group, {}), start)
        if last and start in reported and last <= set(reported[start]):
            out.setdefault(start, set()).add(group)
    return {start: frozenset(groups) for start, groups in out.items()}
