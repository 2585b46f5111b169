"""Maps harness names to their adapters."""

from __future__ import annotations

from rolltap.runner.harnesses.base import Harness
from rolltap.runner.harnesses.claude_code import ClaudeCode
from rolltap.runner.harnesses.codex import Codex
from rolltap.runner.harnesses.errors import UnknownHarness
from rolltap.runner.harnesses.mini_swe_agent import MiniSweAgent
from rolltap.runner.harnesses.opencode import OpenCode
from rolltap.runner.harnesses.openhands import OpenHands
from rolltap.runner.harnesses.oracle import Oracle
from rolltap.runner.harnesses.qwen_code import QwenCode
from rolltap.runner.harnesses.single_call import SingleCall


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
