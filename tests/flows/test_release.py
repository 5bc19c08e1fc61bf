"""pipelines.job.flows.base.release: a micro-batch's cached data released in its handler's ``finally`` never replaces
the error the batch is already failing with (a lost lease; a query stop interrupting the unpersist's RPC)."""

from __future__ import annotations

import pytest

from pipelines.job.flows.base import release


class Cached:
    def __init__(self, fails: bool = False):
        self.fails, self.released = fails, False

    def unpersist(self):
        if self.fails:
            raise RuntimeError("interrupted: BlockManagerMaster.removeRdd")
        self.released = True


def handler(error: Exception | None, *cached):
    try:
        if error is not None:
            raise error
    finally:
        release("gold", 7, *cached)


def test_a_failing_release_does_not_replace_the_batch_error_and_the_rest_is_released():
    broken, df, other = Cached(fails=True), Cached(), Cached()
    with pytest.raises(LookupError, match="the lease was taken over"):
        handler(LookupError("the lease was taken over"), broken, df, other)
    assert df.released and other.released


def test_without_a_batch_error_a_failing_release_raises():
    with pytest.raises(RuntimeError, match="interrupted"):
        handler(None, Cached(), Cached(fails=True))
    done = Cached()
    handler(None, done)
    assert done.released
