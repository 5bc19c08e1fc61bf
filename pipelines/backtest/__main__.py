"""``python -m pipelines.backtest``: see :mod:`pipelines.backtest.run`."""

import sys

from pipelines.backtest.run import main

sys.exit(main())
