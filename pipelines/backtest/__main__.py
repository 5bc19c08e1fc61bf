"""``python -m pipelines.backtest``: see :mod:`pipelines.backtest.cli`."""

import sys

from pipelines.backtest.cli import main

sys.exit(main())
