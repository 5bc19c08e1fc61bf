"""The shipped ``conf/local.toml`` against the typed defaults of ``pipelines/config.py``: one set of values."""

from __future__ import annotations

from pipelines.config import GovernorConfig, load_config

#: Where the shipped file deliberately differs from the code's defaults, and why. Everything else must be equal.
TOML_ONLY = {
    # The state store the shipped governor's checkpoints were written with: a checkpoint records its provider, and a
    # default that changed would not match checkpoints written with the code's defaults (HDFS-backed).
    "spark.conf.spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.conf.spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # Read only when pyspark launches the driver JVM; spark-submit's own --driver-memory decides on a cluster.
    "spark.conf.spark.driver.memory": "4g",
}


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for key, inner in value.items():
            out.update(_flat(inner, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def test_shipped_toml_equals_the_defaults_apart_from_the_listed_overrides():
    shipped, defaults = _flat(load_config("conf/local.toml").model_dump()), _flat(GovernorConfig().model_dump())
    differ = {key: shipped.get(key) for key in shipped.keys() | defaults.keys() if shipped.get(key) != defaults.get(key)}
    assert differ == TOML_ONLY


def test_every_default_is_in_the_shipped_toml():
    # the TOML is where an SRE reads the settings: each field appears there (commented values count as absent)
    import tomllib

    with open("conf/local.toml", "rb") as f:
        written = _flat(tomllib.load(f))
    missing = sorted(key for key in _flat(GovernorConfig().model_dump()) if key not in written
                     and not key.startswith("spark.conf."))
    assert not missing, missing
