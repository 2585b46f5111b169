"""OpenHands (PyPI `openhands`, the V1 CLI on the OpenHands SDK): headless `openhands`."""

from __future__ import annotations

from .base import (
    Dialect,
    Ending,
    HarnessExit,
    Installation,
    Launch,
    Outcome,
    PythonPackages,
    RunContext,
    base_env,
    exit_outcome,
    redact,
)
from .events import json_events


class OpenHands:
    name: str = "openhands"
    dialect: Dialect = "chat"
    packages: PythonPackages = PythonPackages(
        ("openhands==1.16.0", "litellm==1.106.2"), python=(3, 12), python_below=(3, 14)
    )

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        # The CLI has no iteration flag (the SDK's default cap is 500): max_steps is left to the
        # runner's clock and the proxy's budget.
        argv = (
            str(installation.bin_dir / "openhands"),
            "--headless",
            "--json",
            # Without it the LLM_* variables are ignored in favour of agent_settings.json.
            "--override-with-envs",
            "--task",
            ctx.instruction,
        )
        conversations = ctx.logs_dir / "openhands-conversations"
        env = {
            **base_env(ctx, installation),
            "PYTHONUNBUFFERED": "1",
            "LLM_MODEL": f"hosted_vllm/{ctx.model}",
            "LLM_BASE_URL": ctx.openai_base_url,
            "LLM_API_KEY": ctx.key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "OPENHANDS_PERSISTENCE_DIR": str(ctx.home / ".openhands"),
            "OPENHANDS_CONVERSATIONS_DIR": str(conversations),
            "OPENHANDS_WORK_DIR": str(ctx.workdir),
        }
        stdout = ctx.logs_dir / "openhands.out.txt"
        return Launch(
            argv=argv,
            env=env,
            cwd=ctx.workdir,
            stdout_path=stdout,
            logs=(stdout, conversations),
        )

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        for event in json_events(exit.stdout):
            kind = str(event.get("kind", ""))
            if kind in ("ConversationErrorEvent", "AgentErrorEvent"):
                detail = event.get("detail") or event.get("error") or kind
                return Outcome(Ending.PROTOCOL_ERROR, redact(str(detail), ctx))
        if exit.returncode == 0 and "Agent finished" in exit.stdout:
            return Outcome(Ending.FINISHED)
        return exit_outcome(ctx, exit)
