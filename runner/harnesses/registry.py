"""Maps harness names to their adapters."""

from __future__ import annotations

from rolltap.runner.harnesses.base import Harness
from rolltap.runner.harnesses.claude_code import ClaudeCode
from rolltap.runner.harnesses.codex import Codex
from rolltap.runner.harnesses.errors import UnknownHarness
from rolltap.runner.harnesses.mini_swe_agent import MiniSweAgent
from rolltap.runner.harnesses.opencode import OpenCode
from rolltap.runner.harnesses.openhands import OpenHands
from rolltap.runner.harnesses.qwen_code import QwenCode


def adapters() -> dict[str, Harness]:
    """Every adapter, by name, in the order they were brought up."""
    found: list[Harness] = [
        MiniSweAgent(),
        OpenHands(),
        QwenCode(),
        OpenCode(),
        Codex(),
        ClaudeCode(),
    ]
    return {h.name: h for h in found}


def adapter(name: str) -> Harness:
    known = adapters()
    if name not in known:
        raise UnknownHarness(name, list(known))
    return known[name]
