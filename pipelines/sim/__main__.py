"""``python -m pipelines.sim``: write a scenario's landing directory; see :mod:`pipelines.sim.cli`."""

import sys

from pipelines.sim.cli import main

sys.exit(main())
