"""Settings of what operators watch (``[metrics]``, :mod:`pipelines.ops.metrics`); part of
:class:`pipelines.config.GovernorConfig`, importable from :mod:`pipelines.config` too."""

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
