"""The machinery of the typed configuration (:mod:`pipelines.config`, the backtest's settings): strict, immutable
sections, TOML reading, and validation errors that name the setting."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(Exception):
    """The configuration file is missing, not TOML, or has an invalid setting (the message names it)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Base of every config section: unknown keys are errors, values are immutable.
ConfigSection = _Section
_M = TypeVar("_M", bound=BaseModel)


def validate_model(model: type[_M], data: dict) -> _M:
    """Validate a mapping (parsed TOML) against a config model.

    Raises:
        ConfigError: a setting has the wrong type or range, or a key is unknown; the message names it.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid config: {problems}") from None


def read_toml(path: str | Path) -> dict:
    """Read a TOML config file.

    Raises:
        ConfigError: the file does not exist or is not valid TOML.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {file}")
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
