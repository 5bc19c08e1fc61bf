"""``python -m pipelines.quality docs ...``: see :func:`pipelines.quality.gate.main`."""

import sys

from pipelines.quality.gate import main

sys.exit(main())
