"""Qwen Code (`@qwen-code/qwen-code`): headless `qwen` on its OpenAI-compatible auth type."""

from __future__ import annotations

import json

from .base import (
    Dialect,
    Ending,
    HarnessExit,
    Installation,
    Launch,
    NpmPackages,
    Outcome,
    RunContext,
    base_env,
    exit_outcome,
    redact,
)
from .events import last_event

_LIMIT_EXITS = {53: "max session turns", 55: "max wall time or tool calls"}
"""qwen's exit statuses when --max-session-turns, --max-wall-time or --max-tool-calls stop it."""


class QwenCode:
    name: str = "qwen-code"
    dialect: Dialect = "chat"
    packages: NpmPackages = NpmPackages(("@qwen-code/qwen-code@0.24.4",))

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        limit = (f"--max-session-turns={ctx.max_steps}",) if ctx.max_steps is not None else ()
        argv = (
            str(installation.bin_dir / "qwen"),
            "--yolo",
            "--auth-type=openai",
            "--output-format=stream-json",
            *limit,
            # The = form keeps an instruction that starts with "-" from reading as a flag.
            f"--prompt={ctx.instruction}",
        )
        env = {
            **base_env(ctx, installation),
            # Flags would put the key (and the keyed URL) on the command line.
            "OPENAI_API_KEY": ctx.key,
            "OPENAI_BASE_URL": ctx.openai_base_url,
            "OPENAI_MODEL": ctx.model,
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }
        settings = {
            # Otherwise a finished session is followed by a "managed memory" extraction call that
            # runs tools and writes memory files: not part of the task's episode.
            "memory": {"enableManagedAutoMemory": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        }
        qwen_dir = ctx.home / ".qwen"
        stdout = ctx.logs_dir / "qwen-code.jsonl"
        return Launch(
            argv=argv,
            env=env,
            cwd=ctx.workdir,
            files={qwen_dir / "settings.json": json.dumps(settings, indent=2) + "\n"},
            stdout_path=stdout,
            logs=(stdout, qwen_dir / "projects"),
        )

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        if exit.returncode in _LIMIT_EXITS:
            return Outcome(Ending.LIMIT, _LIMIT_EXITS[exit.returncode])
        result = last_event(exit.stdout, "result")
        if result is None:
            return exit_outcome(ctx, exit)
        subtype = str(result.get("subtype", ""))
        if not result.get("is_error"):
            return Outcome(Ending.FINISHED, subtype)
        if "max_turns" in subtype or "max_session_turns" in subtype:
            return Outcome(Ending.LIMIT, subtype)
        error = result.get("error")
        message = error.get("message", "") if isinstance(error, dict) else str(error or "")
        return Outcome(Ending.PROTOCOL_ERROR, redact(message or subtype, ctx))
