"""Codex CLI (`@openai/codex`): `codex exec` on a custom Responses provider in $CODEX_HOME."""

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
from .events import json_events

KEY_VAR = "ROLLTAP_API_KEY"


class Codex:
    name: str = "codex"
    dialect: Dialect = "responses"
    packages: NpmPackages = NpmPackages(("@openai/codex@0.169.0",))

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        codex_home = ctx.home / ".codex"
        argv = (
            str(installation.bin_dir / "codex"),
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--",
            ctx.instruction,
        )
        env = {
            **base_env(ctx, installation),
            "CODEX_HOME": str(codex_home),
            KEY_VAR: ctx.key,
        }
        stdout = ctx.logs_dir / "codex.jsonl"
        return Launch(
            argv=argv,
            env=env,
            cwd=ctx.workdir,
            files={codex_home / "config.toml": self.config(ctx)},
            stdout_path=stdout,
            logs=(stdout, codex_home / "sessions"),
        )

    def config(self, ctx: RunContext) -> str:
        # Only a custom provider honours base_url; env_key names the variable holding the key.
        # Websocket transports reconnect and exit against a plain HTTP server; shell snapshots
        # can hang. Codex has no turn cap in exec mode: max_steps is left to the runner.
        return "\n".join(
            [
                f"model = {_toml(ctx.model)}",
                'model_provider = "rolltap"',
                "",
                "[model_providers.rolltap]",
                'name = "rolltap"',
                f"base_url = {_toml(ctx.openai_base_url)}",
                f'env_key = "{KEY_VAR}"',
                'wire_api = "responses"',
                "",
                "[features]",
                "responses_websockets = false",
                "responses_websockets_v2 = false",
                "shell_snapshot = false",
                "",
                "[analytics]",
                "enabled = false",
                "",
            ]
        )

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        ending: Outcome | None = None
        for event in json_events(exit.stdout):
            kind = event.get("type")
            if kind == "turn.completed":
                ending = Outcome(Ending.FINISHED)
            elif kind == "turn.failed":
                error = event.get("error")
                message = error.get("message", "") if isinstance(error, dict) else str(error)
                ending = Outcome(Ending.PROTOCOL_ERROR, redact(str(message), ctx))
        return ending or exit_outcome(ctx, exit)


def _toml(value: str) -> str:
    """A TOML basic string; JSON's escapes are a subset of TOML's for these values."""
    return json.dumps(value)
