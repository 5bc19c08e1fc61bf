"""The one-regex stats-line parse gives, field for field, what one ``regexp_extract`` per field of the reference
patterns (``STATS_LINE`` and the three detail patterns) gives, on well-formed and adversarial lines."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.config import StatsConfig
from pipelines.dataplane.transforms import checks, parse
from tests.helpers import raw_records

#: The reference grammar, one pattern per part (logback pattern ``%d{yyy-MM-dd HH:mm:ss,GMT+8} %p - %m%n``,
#: docs/rocketmq-formats.md §1-2): the line, then its detail (StatsItem.statPrintDetail, RTStatsItem,
#: MomentStatsItem). The product parses with :data:`pipelines.dataplane.transforms.parse.STATS_LINE_GROUPS`, one regex.
STATS_LINE = (
    r"^(?:(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:,\d{1,3})?\s+)?(?:[A-Z]+\s+)?-\s+"
    r"\[([^\]]*)\]\s+\[([^\]]*)\]\s+Stats (In One Minute|In One Hour|In One Day|Every 5 Minutes),\s*(.*?)\s*$"
)
DETAIL_SUM = r"^SUM:\s*(\S+)\s+TPS:\s*(\S+)\s+AVGPT:\s*(\S+)$"
DETAIL_TIMES = r"^TIMES:\s*(\S+)\s+AVGRT:\s*(\S+)$"
DETAIL_VALUE = r"^Value:\s*(\S+)$"

FIELDS = ["ts_text", "stat_name", "stats_key", "period", "detail", "sum_text", "tps_text", "avgpt_text", "value_text"]
HEAD = "2026-11-22 08:00:00 INFO - [TOPIC_PUT_NUMS] [orders] Stats In One Minute,"
LINES = [
    f"{HEAD} SUM: 60 TPS: 1.00 AVGPT: 2.00",
    f"{HEAD} SUM: 60 TPS: 1.00 AVGPT: 2.00   ",  # trailing blanks
    f"{HEAD}    SUM: 60 TPS: 1.00 AVGPT: 2.00",  # leading blanks
    f"{HEAD} SUM: 60 TPS: 1.00 AVGPT: 2.00 extra",  # not a SUM detail: detail only
    f"{HEAD} SUM: 60\nTPS: 1.00 AVGPT: 2.00",  # a line break inside: not a stats line
    f"{HEAD}\nSUM: 60 TPS: 1.00 AVGPT: 2.00",  # a line break before the detail
    f"{HEAD} SUM: 60 TPS: 1.00 AVGPT: 2.00\n",
    f"{HEAD} SUM: x]y TPS: 1,5 AVGPT: =]",  # separators inside the number groups
    f"{HEAD} TIMES: 12 AVGRT: 3.50",
    f"{HEAD} Value: 1024",
    f"{HEAD} Value: 1024 2048",
    f"{HEAD} SUM: 60 TPS: 1.00",  # cut
    f"{HEAD} ",
    "2026-11-22 08:00:00,123 WARN - [GROUP_GET_NUMS] [orders@g1] Stats In One Hour, SUM: 1 TPS: NaN AVGPT: 0.00",
    "- [a b] [] Stats Every 5 Minutes, Value: 7",  # no timestamp, no level, empty key
    "2026-11-22 08:00:00 INFO - [] [k] Stats In One Day, SUM: 1 TPS: 1 AVGPT: 1",
    "2026-11-22 08:00:00 INFO - [X] [k] Stats In One Week, SUM: 1 TPS: 1 AVGPT: 1",  # unknown period
    "=2026-11-22 08:00:00 INFO - [X] [k] Stats In One Minute, SUM: 1 TPS: 1 AVGPT: 1",  # starts with the marker
    "=]]]]      ",
    "not a stats line at all",
    "",
]


def reference(line):
    """The fields as the parse computed them before: one regexp_extract per field."""
    detail = F.regexp_extract(line, STATS_LINE, 5)

    def ext(col, pattern, i):
        return F.nullif(F.regexp_extract(col, pattern, i), F.lit(""))

    return [
        ext(line, STATS_LINE, 1).alias("ts_text"),
        ext(line, STATS_LINE, 2).alias("stat_name"),
        F.regexp_extract(line, STATS_LINE, 3).alias("stats_key"),
        F.try_element_at(checks.lit_map(parse.rmq.PERIODS), ext(line, STATS_LINE, 4)).alias("period"),
        detail.alias("detail"),
        ext(detail, DETAIL_SUM, 1).alias("sum_text"),
        ext(detail, DETAIL_SUM, 2).alias("tps_text"),
        F.coalesce(ext(detail, DETAIL_SUM, 3), ext(detail, DETAIL_TIMES, 2)).alias("avgpt_text"),
        F.coalesce(ext(detail, DETAIL_TIMES, 1), ext(detail, DETAIL_VALUE, 1)).alias("value_text"),
    ]


def test_one_regex_gives_the_fields_of_one_extract_per_field(spark):
    unwrapped = raw_records(spark, "broker_stats", LINES).transform(parse.unwrap_envelopes)
    got = unwrapped.transform(parse.parse_stats_lines(StatsConfig())).select("raw", *FIELDS)
    want = unwrapped.select("raw", *reference(F.col("line")))
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)
    assert got.where(F.col("sum_text") == "x]y").count() == 1  # the separators inside groups survive


def test_one_regex_evaluation_per_stats_line(spark):
    parsed = raw_records(spark, "broker_stats", LINES[:1]).transform(parse.parse_broker_stats(StatsConfig()))
    spark.conf.set("spark.sql.debug.maxToStringFields", "100000")
    plan = parsed.transform(parse.settled)._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("regexp_extract(") == 0
    assert plan.count("regexp_replace(") == 1
