"""``python -m pipelines.sim``: write a scenario's landing directory; see :mod:`pipelines.sim.simulate`."""

import sys

from pipelines.sim.simulate import main

sys.exit(main())
