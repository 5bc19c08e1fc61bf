"""``python -m pipelines.quality docs ...``: see :func:`pipelines.quality.cli.main`."""

import sys

from pipelines.quality.cli import main

sys.exit(main())
