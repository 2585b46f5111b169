"""mini-swe-agent (PyPI `mini-swe-agent`): Chat Completions through litellm's `hosted_vllm`."""

from __future__ import annotations

import json
from typing import Any

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

# exit_status is the exception's class name when mini gives up on a model call.
_API_ERRORS = frozenset(
    {
        "APIError",
        "APIConnectionError",
        "APIResponseValidationError",
        "AuthenticationError",
        "BadGatewayError",
        "BadRequestError",
        "ContentPolicyViolationError",
        "ContextWindowExceededError",
        "InternalServerError",
        "InvalidRequestError",
        "JSONSchemaValidationError",
        "MidStreamFallbackError",
        "NotFoundError",
        "OpenAIError",
        "PermissionDeniedError",
        "RateLimitError",
        "ServiceUnavailableError",
        "Timeout",
        "UnprocessableEntityError",
        "UnsupportedParamsError",
    }
)


class MiniSweAgent:
    name: str = "mini-swe-agent"
    dialect: Dialect = "chat"
    # litellm pinned below the compromised 1.107.0; without `mcp` every call with tools fails.
    packages: PythonPackages = PythonPackages(
        ("mini-swe-agent==2.4.6", "litellm==1.106.2", "mcp==2.3.0"), python=(3, 10)
    )

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        # Any -c replaces the default config, so mini.yaml comes first.
        config = ["-c", "mini.yaml", "-c", "model.cost_tracking=ignore_errors"]
        if ctx.max_steps is not None:
            config += ["-c", f"agent.step_limit={ctx.max_steps}"]
        argv = (
            str(installation.bin_dir / "mini"),
            "--yolo",
            "--model",
            f"hosted_vllm/{ctx.model}",
            "--cost-limit",
            "0",
            "--environment-class",
            "local",
            *config,
            "--output",
            str(ctx.logs_dir / "mini-swe-agent.traj.json"),
            "--exit-immediately",
            "--task",
            ctx.instruction,
        )
        env = {
            **base_env(ctx, installation),
            "PYTHONUNBUFFERED": "1",
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_SILENT_STARTUP": "1",
            # mini's default is 10 attempts with back-off up to 60 s, which makes a proxy error
            # look like a five-minute hang; litellm maps most HTTP errors from `hosted_vllm`
            # (404 included) to BadRequestError, which mini retries.
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
            "MSWEA_GLOBAL_CONFIG_DIR": str(ctx.home / ".config" / "mini-swe-agent"),
            # litellm otherwise downloads its model cost map at import.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "HOSTED_VLLM_API_BASE": ctx.openai_base_url,
            "HOSTED_VLLM_API_KEY": ctx.key,
        }
        stdout = ctx.logs_dir / "mini-swe-agent.out.txt"
        logs = (ctx.logs_dir / "mini-swe-agent.traj.json", stdout)
        return Launch(argv=argv, env=env, cwd=ctx.workdir, stdout_path=stdout, logs=logs)

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        trajectory = _load(exit.files.get(ctx.logs_dir / "mini-swe-agent.traj.json"))
        info = trajectory.get("info")
        status = str(info.get("exit_status") or "") if isinstance(info, dict) else ""
        if status == "Submitted":
            return Outcome(Ending.FINISHED, status)
        # RepeatedFormatError is mini's max_consecutive_format_errors limit: the model kept
        # answering without a valid action. That is the policy's outcome (reward from the
        # tests), not a failure of the harness.
        if status in ("LimitsExceeded", "TimeExceeded", "RepeatedFormatError"):
            return Outcome(Ending.LIMIT, status)
        if status in _API_ERRORS:
            message = _exit_message(trajectory)
            return Outcome(Ending.PROTOCOL_ERROR, redact(f"{status}: {message}", ctx))
        if status:
            return Outcome(Ending.FAILED, redact(status, ctx))
        return exit_outcome(ctx, exit)


def _load(raw: bytes | None) -> dict[str, Any]:
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _exit_message(trajectory: dict[str, Any]) -> str:
    messages = trajectory.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return str(messages[-1].get("content", ""))
    return ""
