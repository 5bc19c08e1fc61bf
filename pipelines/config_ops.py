"""Settings of what operators watch and say to a running governor (``[metrics]``, :mod:`pipelines.ops.metrics`;
``[overrides]``, :mod:`pipelines.decide.paths.overrides`); part of :class:`pipelines.config.GovernorConfig`, importable
from :mod:`pipelines.config` too."""

from __future__ import annotations

from pydantic import Field

from pipelines.config_base import ConfigSection as _Section


class MetricsConfig(_Section):
    """The continuous job's Prometheus endpoint (:mod:`pipelines.ops.metrics`, docs/metrics.md)."""

    port: int = Field(default=0, ge=0, le=65535, description=(
        "TCP port of ``http://<address>:<port>/metrics`` in the continuous job (not with --once); 0 = no endpoint. "
        "A port that cannot be bound is logged in one line and the governor runs without it."))
    address: str = Field("0.0.0.0", description=(
        "Address the endpoint listens on: ``0.0.0.0`` (every interface, for a Prometheus on another host), "
        "``127.0.0.1`` for this host only."))


class OverridesConfig(_Section):
    """Operators' overrides of a running governor (pin, exempt, release: :mod:`pipelines.decide.paths.overrides`,
    docs/operators.md §9)."""

    max_duration_seconds: int = Field(default=86_400, gt=0, description=(
        "Seconds: the longest an override may last, from its start to its end; none lasts forever. A longer one is "
        "refused by the command and ignored (logged) by the governor. One day by default: a sale or a business day "
        "(this project's choice; Alertmanager silences and MQCloud's manual limits have no maximum, and are "
        "forgotten)."))
