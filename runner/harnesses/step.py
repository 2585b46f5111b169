"""rolltap-step: a scripted agent's step, for reference solutions that act as agents.

The oracle copies this file (stdlib only, run inside the sandbox) to /solution/rolltap-step.
`python3 /solution/rolltap-step COMMAND` does what a harness does with a model's tool call:
it sends the conversation so far, ending with COMMAND as the assistant's tool call, to the
rollout's proxy in the dialect of `ROLLTAP_STEP_DIALECT` (chat, responses or messages), then
runs COMMAND with bash, prints its output and exits with its status; the next step sends that
output back as the call's tool result. The oracle's proxy serves no model and refuses every
call, but records it, request body included: what a scripted exploit ran is in the record as
a real harness's commands would be, for the reward-hack detectors (analysis/hacks.py).

The conversation is kept in `ROLLTAP_STEP_STATE` (default: $HOME/.rolltap-steps.json).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

OUTPUT_LIMIT = 20_000
TIMEOUT_SEC = 30
TOOL = {
    "name": "bash",
    "description": "Run a bash command.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: rolltap-step COMMAND", file=sys.stderr)
        return 2
    command = argv[0]
    state_path = os.environ.get("ROLLTAP_STEP_STATE") or os.path.join(
        os.environ.get("HOME", "/tmp"), ".rolltap-steps.json"
    )
    steps = _load(state_path)
    _send(steps, command)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    output = (done.stdout + done.stderr)[-OUTPUT_LIMIT:]
    steps.append({"command": command, "output": output, "status": done.returncode})
    with open(state_path, "w") as f:
        json.dump(steps, f)
    return done.returncode


def _load(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            loaded = json.load(f)
    except (OSError, ValueError):
        return []
    return loaded if isinstance(loaded, list) else []


def _send(steps: list[dict[str, Any]], command: str) -> None:
    """The conversation as the dialect spells it, to the proxy; its answer is not needed."""
    dialect = os.environ.get("ROLLTAP_STEP_DIALECT", "chat")
    model = os.environ.get("ROLLTAP_MODEL", "oracle")
    calls = [*steps, {"command": command}]
    if dialect == "responses":
        url = os.environ.get("OPENAI_BASE_URL", "") + "/responses"
        body: dict[str, Any] = {
            "model": model,
            "input": _responses(calls),
            "tools": [{"type": "function", **TOOL}],
        }
    elif dialect == "messages":
        url = os.environ.get("ANTHROPIC_BASE_URL", "") + "/v1/messages"
        tool = {
            "name": TOOL["name"],
            "description": TOOL["description"],
            "input_schema": TOOL["parameters"],
        }
        body = {"model": model, "max_tokens": 1024, "messages": _messages(calls), "tools": [tool]}
    else:
        url = os.environ.get("OPENAI_BASE_URL", "") + "/chat/completions"
        body = {
            "model": model,
            "messages": _chat(calls),
            "tools": [{"type": "function", "function": TOOL}],
        }
    key = os.environ.get("OPENAI_API_KEY", "")
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {key}",
            "x-api-key": key,
            "anthropic-version": "2023-06-01",
        },
    )
    # Refused (the oracle serves no model), or no proxy at all: the step runs all the same.
    with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
        urllib.request.urlopen(request, timeout=TIMEOUT_SEC).read()


def _chat(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "(scripted agent)"}]
    for i, step in enumerate(calls):
        arguments = json.dumps({"command": step["command"]})
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        if "output" in step:
            messages.append(
                {"role": "tool", "tool_call_id": f"call_{i}", "content": step["output"]}
            )
    return messages


def _responses(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "(scripted agent)"}],
        }
    ]
    for i, step in enumerate(calls):
        arguments = json.dumps({"cmd": step["command"]})
        items.append(
            {
                "type": "function_call",
                "call_id": f"call_{i}",
                "name": "exec_command",
                "arguments": arguments,
            }
        )
        if "output" in step:
            items.append(
                {"type": "function_call_output", "call_id": f"call_{i}", "output": step["output"]}
            )
    return items


def _messages(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "(scripted agent)"}]
    for i, step in enumerate(calls):
        use = {
            "type": "tool_use",
            "id": f"toolu_{i}",
            "name": "Bash",
            "input": {"command": step["command"]},
        }
        messages.append({"role": "assistant", "content": [use]})
        if "output" in step:
            result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": step["output"]}
            messages.append({"role": "user", "content": [result]})
    return messages


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
