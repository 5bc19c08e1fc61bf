"""What a sweep case is: the drawn record (:class:`Case`), the scenario each kind runs as (:data:`SCENARIO_OF`)
and the fixed start of every case's run. :mod:`pipelines.sim.draws` draws cases, :mod:`pipelines.sim.premise`
judges whether a drawn one stands for its kind, :mod:`pipelines.sim.sweep` runs and judges them."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pipelines.sim.irregular import world_order

#: The sweep's command (a case's replay line).
PROG = "python -m pipelines.sim.sweep"
#: A fixed start (UTC): a case's rows do not depend on the day it runs.
START = dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc)
#: Kinds run as the scenario "compound" (:func:`pipelines.sim.causes.shape_compound`); SCENARIO_OF: run as another.
COMPOUND = ("two_surges", "storm_and_surge", "shared_library", "spread_surge", "flash_overload", "near_capacity",
            "surge_and_flash", "recurring_surge", "tight_surge")
SCENARIO_OF = {**{k: "compound" for k in COMPOUND}, "cold_start": "persisting_storm",
               "spread_storm_fixed": "storm_fixed_legit_retry", "fixed_high_retry": "storm_fixed_legit_retry",
               "legit_high_retry": "legit_retry"}


@dataclass(frozen=True)
class Case:
    """One drawn closed loop: ``kind`` (:data:`pipelines.sim.draws.KINDS`), the spec's fields (``spec``, of the scenario
    :data:`SCENARIO_OF` names, else of ``kind``), the propagation delay (s), the clients' and the brokers' settings
    that differ from ``conf/backtest.toml`` and the world's irregularities
    (:class:`pipelines.sim.irregular.Irregularity` fields); ``hosts``: the brokers of its causes (drawn world)."""

    seed: int
    kind: str
    spec: dict[str, Any]
    propagation_seconds: float
    clients: dict[str, Any] = field(default_factory=dict)
    broker: dict[str, Any] = field(default_factory=dict)
    irregular: dict[str, Any] = field(default_factory=dict)
    hosts: tuple[str, ...] = ()

    @property
    def scenario(self) -> str:
        return SCENARIO_OF.get(self.kind, self.kind)

    def describe(self) -> str:
        items = ", ".join(f"{k}={v}" for k, v in sorted(self.spec.items()))
        extra = ", ".join(f"{k}={v}" for k, v in sorted({**self.clients, **self.broker}.items()))
        world = ", ".join(f"{k}={v}" for k, v in sorted(self.irregular.items(), key=world_order) if k != "seed")
        return (f"case {self.seed}: {self.kind} ({items}); propagation {self.propagation_seconds:g} s"
                + (f"; clients/brokers {extra}" if extra else "") + (f"; world {world}" if world else ""))

    def replay(self) -> str:
        return f"{PROG} --case {self.seed}"
