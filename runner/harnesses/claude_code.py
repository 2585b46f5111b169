"""Claude Code (`@anthropic-ai/claude-code`): `claude -p` speaking Anthropic Messages."""

from __future__ import annotations

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


class ClaudeCode:
    name: str = "claude-code"
    dialect: Dialect = "messages"
    packages: NpmPackages = NpmPackages(("@anthropic-ai/claude-code@2.1.330",))

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        config_dir = ctx.home / ".claude"
        limit = ("--max-turns", str(ctx.max_steps)) if ctx.max_steps is not None else ()
        argv = (
            str(installation.bin_dir / "claude"),
            "--print",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            *limit,
            "--",
            ctx.instruction,
        )
        model = ctx.model
        env = {
            **base_env(ctx, installation),
            "CLAUDE_CONFIG_DIR": str(config_dir),
            # As root, --dangerously-skip-permissions is refused unless the CLI is told it runs
            # in a sandbox (and bypassPermissions alone exits without calling the model).
            "IS_SANDBOX": "1",
            # The SDK appends /v1/messages itself.
            "ANTHROPIC_BASE_URL": ctx.rollout_url.rstrip("/"),
            "ANTHROPIC_AUTH_TOKEN": ctx.key,
            "ANTHROPIC_MODEL": model,
            # Side calls (titles, sub-agents, compaction) would otherwise name Anthropic models.
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            # No /api/hello probe, update checks, telemetry or error reports.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # The billing line at the top of the system prompt changes between runs and breaks
            # prompt-prefix chains.
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        }
        stdout = ctx.logs_dir / "claude-code.jsonl"
        return Launch(
            argv=argv,
            env=env,
            cwd=ctx.workdir,
            stdout_path=stdout,
            logs=(stdout, config_dir / "projects"),
        )

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        result = last_event(exit.stdout, "result")
        if result is None:
            return exit_outcome(ctx, exit)
        subtype = str(result.get("subtype", ""))
        text = redact(str(result.get("result") or subtype), ctx)
        if result.get("api_error_status") is not None:
            status = result["api_error_status"]
            return Outcome(Ending.PROTOCOL_ERROR, redact(f"HTTP {status}: {text}", ctx))
        if subtype == "error_max_turns":
            return Outcome(Ending.LIMIT, subtype)
        if result.get("is_error"):
            return Outcome(Ending.FAILED, text)
        return Outcome(Ending.FINISHED, subtype)
