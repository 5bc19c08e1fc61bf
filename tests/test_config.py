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


def _fields(model, prefix: str = ""):
    """(dotted name, field) of every field of ``model`` and of the sections it holds."""
    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        yield f"{prefix}{name}", field
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _fields(field.annotation, f"{prefix}{name}.")


#: The unit a field's name promises, and the word its description must use for it.
UNITS = {"_seconds": "second", "_ms": "millisecond", "_qps": "msg/s", "_tps": "msg/s", "_pct": "percent",
         "_days": "day", "_chars": "character", "_rows": "row"}


def test_every_setting_is_documented_once_in_the_code_with_its_unit():
    fields = dict(_fields(GovernorConfig))
    undocumented = sorted(name for name, field in fields.items() if not (field.description or "").strip())
    assert not undocumented, undocumented
    unitless = sorted(name for name, field in fields.items() for suffix, unit in UNITS.items()
                      if name.endswith(suffix) and unit not in field.description.lower())
    assert not unitless, unitless
