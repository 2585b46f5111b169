"""Where command output goes: a terminal as it is, and a pipe or log without wrapping."""

from __future__ import annotations

import sys

from rich.console import Console


def console_for_output() -> Console:
    # Piped output is for grep and people's logs: do not squeeze it into 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=220)
