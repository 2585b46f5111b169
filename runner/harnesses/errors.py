"""Errors of the harness layer.

HarnessError
 ├── UnknownHarness   no adapter by that name
 ├── NotInstalled     the adapter exists but `rolltap harness install NAME` has not run
 └── InstallFailed    an install step (venv, pip, npm) failed
"""

from __future__ import annotations


class HarnessError(Exception):
    pass


class UnknownHarness(HarnessError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown harness {name!r} (known: {', '.join(known)})")


class NotInstalled(HarnessError):
    def __init__(self, name: str) -> None:
        super().__init__(f"harness {name!r} is not installed: run `rolltap harness install {name}`")


class InstallFailed(HarnessError):
    pass
