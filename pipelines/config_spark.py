"""The ``[spark]`` section of the config (:class:`SparkConfig`): the Spark session and the deciding queries' own
Spark settings. Importable from :mod:`pipelines.config`."""

from __future__ import annotations

from pydantic import Field

from pipelines.config_base import ConfigSection as _Section

#: Default of ``[spark] decision_conf`` (:class:`SparkConfig`): the ``fast`` and ``gold`` queries run their small
#: micro-batches without code generation and without broadcast joins. ``spark.sql.codegen.factoryMode`` is Spark's
#: internal switch between generated and interpreted expressions (``CodeGeneratorWithInterpretedFallback``, Spark
#: 3.0+); both are complete. A broadcast join runs its small side as a Spark job of its own: with them a gold
#: micro-batch ran 16-19 jobs, without them 4. ``spark.sql.maxSinglePartitionBytes`` unbounded: a join whose sides
#: are both one partition stays in that partition only while Spark's size
#: estimate of each side is under this bound (``EnsureRequirements``, Spark 4.x; default 128 MiB), and a side read
#: from an RDD or a local relation has no estimate (``spark.sql.defaultSizeInBytes``, Long.MaxValue), so each such
#: join shuffled both sides to ``spark.sql.shuffle.partitions``: a stage more per join (docs/performance.md).
DECISION_QUERY_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                       "spark.sql.autoBroadcastJoinThreshold": "-1",
                       "spark.sql.maxSinglePartitionBytes": str(2**63 - 1)}


class SparkConfig(_Section):
    """The Spark session (:func:`pipelines.dataplane.session.build_session`)."""

    master: str = Field("local[2]", description=(
        "Spark master; ``local[2]`` for the embedded default (this project's 2-core machine). spark-submit's "
        "``--master`` decides on a cluster."))
    app_name: str = Field("rate-governor", description="Spark application name.")
    shuffle_partitions: int = Field(default=4, gt=0, description=(
        "``spark.sql.shuffle.partitions`` (Spark's default 200 is far too many for micro-batches): twice the "
        "cores of ``local[2]``. A restarted query keeps the value its checkpoint was started with."))
    adaptive_execution: bool = Field(False, description=(
        "``spark.sql.adaptive.enabled`` for the micro-batch DataFrames (streaming plans of stateful queries never use "
        "it). Off: at micro-batch sizes AQE's re-planning and one Spark job per shuffle stage cost more than it "
        "saves (ingest: 11 jobs per micro-batch with it, 5 without; processing per stats minute 16.2-16.4 s with "
        "it, 14.2 s without in ``bench/batch_profile.py`` on this 2-core machine). Turn on for large backlogs on "
        "a cluster, where skewed joins and partition coalescing pay."))
    decision_conf: dict[str, str] = Field(default_factory=lambda: dict(DECISION_QUERY_CONF), description=(
        "Spark SQL settings of the ``fast`` and ``gold`` queries only (the sessions Spark clones for them when they "
        "start; the ``ingest`` query and everything else keep the session's own). Default "
        "(:data:`DECISION_QUERY_CONF`): whole-stage code generation off, expressions interpreted "
        "(``spark.sql.codegen.factoryMode = NO_CODEGEN``, an internal Spark setting) and no broadcast joins, "
        "because their micro-batches hold hundreds of rows in short Spark jobs, where generating and JIT-compiling "
        "classes and a job per broadcast cost more than they save, and joins of one-partition sides without a "
        "shuffle (``spark.sql.maxSinglePartitionBytes`` unbounded): ``bench/batch_profile.py``, docs/performance.md. "
        "``{}`` = Spark's defaults."))
    conf: dict[str, str] = Field(default_factory=dict, description=(
        "Extra Spark settings, passed as given. The shipped TOML adds the RocksDB state store with changelog "
        "checkpointing (what its checkpoints were written with) and a 4 GiB driver."))


#: GX validates a DataFrame of up to this many rows with its pandas engine on the driver, a larger one with its
#: Spark engine (pipelines/dataplane/quality/validation.py Validator; the crossover measured in docs/performance.md).
