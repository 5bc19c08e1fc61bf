"""What differs between the supported Spark lines (pyspark 4.0 to 4.3), in one place.

The governor runs unchanged on every line ``pyproject.toml`` allows; where a pyspark API it uses changed between
lines, the one adapter is here, with the lines it covers. docs/spark.md lists what was tested on which.
"""

from __future__ import annotations

import inspect

from pyspark.sql.types import StructType

#: The session time zone of every rate-governor job (:mod:`pipelines.dataplane.session`): Arrow timestamps are UTC.
ARROW_TIME_ZONE = "UTC"


def arrow_schema(schema: StructType):
    """The ``pyarrow.Schema`` of a Spark schema with Spark's own type mapping (timestamps: microseconds, UTC).

    pyspark 4.0's ``to_arrow_schema(schema, timestamp_utc=True)`` made every ``TimestampType`` UTC; from 4.1 on
    it takes a keyword-only ``timezone`` and asserts it is given for a ``TimestampType``
    (``pyspark/sql/pandas/types.py`` of each release). Both give ``timestamp[us, tz=UTC]`` here.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone=ARROW_TIME_ZONE)
    return to_arrow_schema(schema)
