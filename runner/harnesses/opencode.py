"""OpenCode (`opencode-ai`): `opencode run` on a custom OpenAI-compatible provider."""

from __future__ import annotations

import json
from typing import Any

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
PROVIDER = "rolltap"


class OpenCode:
    name: str = "opencode"
    dialect: Dialect = "chat"
    packages: NpmPackages = NpmPackages(("opencode-ai@1.18.33",))

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        config_path = ctx.home / ".config" / "rolltap" / "opencode.json"
        argv = (
            str(installation.bin_dir / "opencode"),
            "run",
            "--format",
            "json",
            "--model",
            f"{PROVIDER}/{ctx.model}",
            "--",
            ctx.instruction,
        )
        env = {
            **base_env(ctx, installation),
            "OPENCODE_CONFIG": str(config_path),
            KEY_VAR: ctx.key,
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
        stdout = ctx.logs_dir / "opencode.jsonl"
        return Launch(
            argv=argv,
            env=env,
            cwd=ctx.workdir,
            files={config_path: json.dumps(self.config(ctx), indent=2) + "\n"},
            stdout_path=stdout,
            logs=(stdout, ctx.home / ".local" / "share" / "opencode"),
        )

    def config(self, ctx: RunContext) -> dict[str, Any]:
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"{PROVIDER}/{ctx.model}",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": PROVIDER,
                    # {env:...} is OpenCode's own substitution: the key stays off the disk.
                    "options": {"baseURL": ctx.openai_base_url, "apiKey": f"{{env:{KEY_VAR}}}"},
                    "models": {ctx.model: {"name": ctx.model}},
                }
            },
        }
        if ctx.max_steps is not None:
            # OpenCode has no cap by default. `steps` is soft: past N it appends a "MAXIMUM STEPS
            # REACHED, respond with text only" message to every request but still runs the tool
            # calls a model insists on, so the runner's clock remains the hard stop.
            config["agent"] = {"build": {"steps": ctx.max_steps}}
        return config

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        finished = False
        for event in json_events(exit.stdout):
            kind = event.get("type")
            if kind == "error":
                return Outcome(Ending.PROTOCOL_ERROR, redact(_error_text(event), ctx))
            part = event.get("part")
            if kind == "step_finish" and isinstance(part, dict):
                finished = part.get("reason") not in ("tool-calls", "error")
        if finished and exit.returncode == 0:
            return Outcome(Ending.FINISHED)
        return exit_outcome(ctx, exit)


def _error_text(event: dict[str, Any]) -> str:
    error = event.get("error")
    if isinstance(error, dict):
        data = error.get("data")
        if isinstance(data, dict) and data.get("message"):
            return f"{error.get('name', 'error')}: {data['message']}"
        return str(error.get("name") or error)
    return str(error or event)
