"""Command-line conventions shared by every entry point: one clear line on stderr and a non-zero exit for a bad
flag, a missing file or a bad config (argparse's own two-line usage error is folded into one line)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

USAGE_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line: ``<prog>: error: <message> (see --help)``."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def fail(prog: str, message: object) -> int:
    """Print ``<prog>: <message>`` on stderr and return the usage-error exit code."""
    print(f"{prog}: {message}", file=sys.stderr)
    return USAGE_ERROR
