"""Maps harness names to their adapters."""

from __future__ import annotations

from .base import Harness
from .claude_code import ClaudeCode
from .codex import Codex
from .errors import UnknownHarness
from .mini_swe_agent import MiniSweAgent
from .opencode import OpenCode
from .openhands import OpenHands
from .oracle import Oracle
from .qwen_code import QwenCode
from .single_call import SingleCall


def adapters() -> dict[str, Harness]:
    """Every agent harness adapter (installed with `rolltap harness install`), by name, in the
    order they were brought up."""
    found: list[Harness] = [
        MiniSweAgent(),
        OpenHands(),
        QwenCode(),
        OpenCode(),
        Codex(),
        ClaudeCode(),
    ]
    return {h.name: h for h in found}


def builtins() -> dict[str, Harness]:
    """Harnesses that are part of rolltap and need no install: the oracle, single-call."""
    found: list[Harness] = [Oracle(), SingleCall()]
    return {h.name: h for h in found}


def adapter(name: str) -> Harness:
    """An agent harness or a built-in one, by name."""
    known = adapters() | builtins()
    if name not in known:
        raise UnknownHarness(name, list(known))
    return known[name]
