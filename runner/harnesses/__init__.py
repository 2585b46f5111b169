"""Adapters that run unmodified agent harnesses, behind one Protocol."""

from rolltap.runner.harnesses.base import (
    Dialect,
    Ending,
    Harness,
    HarnessExit,
    Installation,
    Launch,
    Outcome,
    RunContext,
)
from rolltap.runner.harnesses.errors import (
    HarnessError,
    InstallFailed,
    NotInstalled,
    UnknownHarness,
)
from rolltap.runner.harnesses.install import (
    harness_root,
    image_installation,
    install,
    installation,
)
from rolltap.runner.harnesses.registry import adapter, adapters, builtins

__all__ = [
    "Dialect",
    "Ending",
    "Harness",
    "HarnessError",
    "HarnessExit",
    "InstallFailed",
    "Installation",
    "Launch",
    "NotInstalled",
    "Outcome",
    "RunContext",
    "UnknownHarness",
    "adapter",
    "adapters",
    "builtins",
    "harness_root",
    "image_installation",
    "install",
    "installation",
]
