"""What lands in the governor's landing directory, and when: the log shippers of the closed loop through Spark.

* **Stats lines.** Broker ``b``'s ``stats.log`` lines of minute ``m`` (printed at the end of the minute, rendered by
  :func:`pipelines.sim.minutes.stats_files` from what the brokers admitted, :func:`pipelines.sim.admitted.
  admitted_rows`) land as one file, ``broker_stats/<b>/m<stamp index>.log``, when the simulator's shipping model
  says: :func:`pipelines.sim.irregular.stats_landings` (``shipping.stats_seconds`` after the end of the minute, or
  the broker's own delay, + jitter; a dropped minute never lands; a broker whose shipper stopped ships nothing from
  its stop minute on). A minute shipped twice lands a second time, the same text under a new name
  (``m<stamp index>.resent-<n>.log``), as a shipper re-sending a file after its restart: Spark's file source reads
  a name once, and the governor counts a window's stats lines as a set, so the copy must not count twice.
* **Send-failure lines.** Each rejected attempt's line lands ``shipping.failures_seconds`` after it was logged (or
  with the shipper's next batch, every ``shipping.failures_batch_seconds``), the demand's trickle of ordinary
  failures included, in one ``send_failures/s<serial>.jsonl`` file per landing instant.

Times are the scenario's simulated UTC; seconds of the shipping model count from the scenario's start.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipelines.sim.admitted import admitted_rows, failure_rows, trickle
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.irregular import Irregularity, stats_landings
from pipelines.sim.minutes import failure_text, stats_files
from pipelines.sim.settings import ShippingConfig


class Shipper:
    """What has landed by a simulated time (module docstring). The cluster must have run to the time asked for.

    Raises:
        ValueError: ``irregular`` names a broker the cluster does not have.
    """

    def __init__(self, cluster: ClosedLoopCluster, shipping: ShippingConfig, rng: np.random.Generator,
                 irregular: Irregularity | None = None) -> None:
        self.cluster, self.ship, self.rng = cluster, shipping, rng
        self.landings = stats_landings(irregular or Irregularity(), cluster.brokers, cluster.T,
                                       shipping.stats_seconds)
        self.background = trickle(cluster, rng)
        self.next_landing = 0
        self.admitted: dict[int, pd.DataFrame] = {}
        self.rendered: dict[int, dict[str, tuple[str, str]]] = {}  # minute → broker → (path, text)
        self.sent: dict[tuple[int, str], int] = {}  # (minute, broker) → times landed
        self.logged = self.trickled = 0

    @property
    def last_landing(self) -> pd.Timestamp:
        """When the last stats file lands (UTC)."""
        last = self.landings[-1][0] if self.landings else self.ship.stats_seconds + self.cluster.T * 60
        return self.cluster.start + pd.Timedelta(seconds=last)

    def due(self, t: pd.Timestamp, serial: int) -> tuple[list[tuple[str, str]], list[int], int]:
        """(files to land at ``t``: relative path and text, the minutes whose stats lines they hold, failure lines);
        ``serial`` names the failures file."""
        files, minutes = self._stats_due(t)
        failures = self._failures_due(t)
        n = 0
        if len(failures):
            files.append((f"send_failures/s{serial:05d}.jsonl", failure_text(failures)))
            n = len(failures)
        return files, minutes, n

    def _stats_due(self, t: pd.Timestamp) -> tuple[list[tuple[str, str]], list[int]]:
        c = self.cluster
        upto = (t - c.start).total_seconds()
        due = []
        while self.next_landing < len(self.landings) and self.landings[self.next_landing][0] <= upto:
            due.append(self.landings[self.next_landing][1:])
            self.next_landing += 1
        self._render(sorted({m for m, _ in due} - set(self.rendered)))
        files = []
        for m, b in due:
            if b not in self.rendered[m]:  # the broker printed no line that minute
                continue
            n = self.sent[(m, b)] = self.sent.get((m, b), 0) + 1
            path, text = self.rendered[m][b]
            files.append((path if n == 1 else path.removesuffix(".log") + f".resent-{n - 1}.log", text))
        return files, sorted({m for m, _ in due})

    def _render(self, minutes: list[int]) -> None:
        """Render the stats files of ``minutes`` (every broker's), from the admitted rows of every minute up to the
        last of them (a broker's hour lines read the minutes before)."""
        if not minutes:
            return
        c = self.cluster
        for m in range(max(minutes) + 1):
            if m not in self.admitted:
                self.admitted[m] = admitted_rows(c, m)
        rendered = stats_files(c.spec, pd.concat(self.admitted.values(), ignore_index=True), set(minutes))
        for m in minutes:
            self.rendered[m] = {path.split("/")[1]: (path, text) for path, text in rendered.get(m, [])}

    def _failures_due(self, t: pd.Timestamp) -> pd.DataFrame:
        c, ship = self.cluster, self.ship
        cutoff = t - pd.Timedelta(seconds=ship.failures_seconds)
        if ship.failures_batch_seconds > 0:
            batch = ship.failures_batch_seconds
            cutoff = pd.Timestamp(int(math.floor(cutoff.value / 1e9 / batch) * batch * 1e9), tz="UTC")
        last_tick = int(np.floor((cutoff - c.start).total_seconds() / c.dt))
        upto = self.logged
        while upto < len(c.rejections.tick) and c.rejections.tick[upto] < last_tick:
            upto += 1
        parts = [failure_rows(c, self.logged, upto, self.rng)]
        self.logged = upto
        bg_end = int(self.background["event_time"].searchsorted(cutoff, side="left")) if len(self.background) else 0
        parts.append(self.background.iloc[self.trickled:bg_end])
        self.trickled = max(self.trickled, bg_end)
        parts = [p for p in parts if len(p)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
