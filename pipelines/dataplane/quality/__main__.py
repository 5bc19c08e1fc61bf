"""``python -m pipelines.dataplane.quality docs ...``: see :func:`pipelines.dataplane.quality.cli.main`."""

import sys

from pipelines.dataplane.quality.cli import main

sys.exit(main())
