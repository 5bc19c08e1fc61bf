"""One governor per lake: the lease refuses a second holder, expires for a crashed one, and notices a take-over."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest

from pipelines.job.lease import LEASE_FILE, GovernorLease, LakeHeldError

T0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self, now: dt.datetime = T0) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def _other_host(lake, **changes) -> None:
    """Rewrite the lease as if its holder ran on another machine (its pid cannot be checked from here)."""
    path = lake / LEASE_FILE
    lease = json.loads(path.read_text())
    lease.update({"host": "node-7", "owner": "node-7:4242:2026-11-23T11:00:00Z", "pid": 4242}, **changes)
    path.write_text(json.dumps(lease))


def test_second_holder_is_refused_with_one_line_naming_the_first(tmp_path):
    clock = Clock()
    first = GovernorLease(str(tmp_path), ttl_seconds=60, clock=clock)
    first.acquire()
    first.acquire()  # re-entrant for its owner
    _other_host(tmp_path)
    second = GovernorLease(str(tmp_path), ttl_seconds=60, clock=clock)
    with pytest.raises(LakeHeldError) as refused:
        second.acquire()
    message = str(refused.value)
    assert message == (
        f"lake {tmp_path} is held by node-7:4242 since 2026-11-23T12:00:00Z "
        "(lease expires 2026-11-23T12:01:00Z); stop it or wait"
    )
    assert "\n" not in message and not second.held


def test_expired_lease_is_taken_over_and_the_old_holder_notices(tmp_path):
    clock = Clock()
    old = GovernorLease(str(tmp_path), ttl_seconds=60, clock=clock)
    old.acquire()
    _other_host(tmp_path)
    new = GovernorLease(str(tmp_path), ttl_seconds=60, clock=clock)
    clock.now = T0 + dt.timedelta(seconds=59)
    with pytest.raises(LakeHeldError):
        new.acquire()
    clock.now = T0 + dt.timedelta(seconds=61)
    new.acquire()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["owner"] == new.owner
    assert new.renew()
    # the old holder (hung past its ttl) must not renew over the new one
    assert not old.renew() and old.lost
    assert json.loads((tmp_path / LEASE_FILE).read_text())["owner"] == new.owner


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    clock = Clock()
    GovernorLease(str(tmp_path), ttl_seconds=600, clock=clock).acquire()
    lease = json.loads((tmp_path / LEASE_FILE).read_text())
    lease.update(pid=int(dead.stdout), owner=f"{lease['host']}:{int(dead.stdout)}:x")
    (tmp_path / LEASE_FILE).write_text(json.dumps(lease))
    new = GovernorLease(str(tmp_path), ttl_seconds=600, clock=clock)
    new.acquire()  # unexpired, but its process is gone
    assert new.held


def test_renew_after_take_over_reports_lost_and_release_keeps_the_new_lease(tmp_path):
    clock = Clock()
    mine = GovernorLease(str(tmp_path), ttl_seconds=60, clock=clock)
    mine.acquire()
    _other_host(tmp_path)  # someone else holds it now
    assert not mine.renew() and mine.lost
    mine.release()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["host"] == "node-7"


def test_renewing_thread_extends_and_release_removes(tmp_path):
    lease = GovernorLease(str(tmp_path), ttl_seconds=3)
    lease.acquire()
    first = json.loads((tmp_path / LEASE_FILE).read_text())["renewed_at"]
    lease.start_renewing()
    import time

    time.sleep(2.3)  # two renewals at 1 s intervals
    assert json.loads((tmp_path / LEASE_FILE).read_text())["renewed_at"] > first
    lease.release()
    assert not (tmp_path / LEASE_FILE).exists()


def test_corrupt_lease_counts_as_stale(tmp_path):
    (tmp_path / LEASE_FILE).write_text("{half")
    lease = GovernorLease(str(tmp_path), ttl_seconds=60)
    lease.acquire()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["owner"] == lease.owner
