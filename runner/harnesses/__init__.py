"""Adapters that run unmodified agent harnesses, behind one Protocol."""

from .base import Dialect, Ending, Harness, HarnessExit, Installation, Launch, Outcome, RunContext
from .errors import HarnessError, InstallFailed, NotInstalled, UnknownHarness
from .install import harness_root, image_installation, install, installation
from .registry import adapter, adapters, builtins

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
