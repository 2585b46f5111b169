"""Each adapter's reading of how its harness ended, on output shaped like the real harness's."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

import pytest

from rolltap.runner.harnesses import Ending, HarnessExit, RunContext, adapters

KEY = "rk_secret_77"
LOGS = PurePosixPath("/logs/agent")
CTX = RunContext(
    instruction="x",
    rollout_url=f"http://p/r/{KEY}",
    key=KEY,
    model="m",
    workdir=PurePosixPath("/w"),
    home=PurePosixPath("/h"),
    logs_dir=LOGS,
)


def lines(*events: dict[str, object]) -> str:
    return "banner line\n" + "\n".join(json.dumps(e) for e in events) + "\n"


def traj(status: str, last: str = "") -> dict[PurePosixPath, bytes]:
    data = {"info": {"exit_status": status}, "messages": [{"role": "exit", "content": last}]}
    return {LOGS / "mini-swe-agent.traj.json": json.dumps(data).encode()}


CASES = [
    ("mini-swe-agent", HarnessExit(0, files=traj("Submitted")), Ending.FINISHED),
    ("mini-swe-agent", HarnessExit(0, files=traj("LimitsExceeded")), Ending.LIMIT),
    ("mini-swe-agent", HarnessExit(0, files=traj("RepeatedFormatError")), Ending.LIMIT),
    (
        "mini-swe-agent",
        HarnessExit(1, files=traj("BadRequestError", f"404 at /r/{KEY}/v1")),
        Ending.PROTOCOL_ERROR,
    ),
    ("mini-swe-agent", HarnessExit(1, files=traj("FileNotFoundError")), Ending.FAILED),
    ("mini-swe-agent", HarnessExit(None), Ending.FAILED),
    (
        "codex",
        HarnessExit(0, lines({"type": "turn.started"}, {"type": "turn.completed"})),
        Ending.FINISHED,
    ),
    (
        "codex",
        HarnessExit(
            1,
            lines(
                {"type": "error", "message": "Reconnecting... 1/5"},
                {
                    "type": "turn.failed",
                    "error": {"message": f"unexpected status 404, url /r/{KEY}"},
                },
            ),
        ),
        Ending.PROTOCOL_ERROR,
    ),
    (
        "claude-code",
        HarnessExit(0, lines({"type": "result", "subtype": "success", "is_error": False})),
        Ending.FINISHED,
    ),
    (
        "claude-code",
        HarnessExit(
            1,
            lines(
                {"type": "result", "subtype": "success", "is_error": True, "api_error_status": 404}
            ),
        ),
        Ending.PROTOCOL_ERROR,
    ),
    (
        "claude-code",
        HarnessExit(1, lines({"type": "result", "subtype": "error_max_turns", "is_error": True})),
        Ending.LIMIT,
    ),
    ("claude-code", HarnessExit(1, "", "Error: boom"), Ending.FAILED),
    (
        "qwen-code",
        HarnessExit(0, lines({"type": "result", "subtype": "success", "is_error": False})),
        Ending.FINISHED,
    ),
    (
        "qwen-code",
        HarnessExit(
            1,
            lines({"type": "result", "is_error": True, "error": {"message": "[API Error: 404]"}}),
        ),
        Ending.PROTOCOL_ERROR,
    ),
    ("qwen-code", HarnessExit(53, "", "Reached max session turns"), Ending.LIMIT),
    (
        "opencode",
        HarnessExit(0, lines({"type": "step_finish", "part": {"reason": "stop"}})),
        Ending.FINISHED,
    ),
    (
        "opencode",
        HarnessExit(
            1, lines({"type": "error", "error": {"name": "APIError", "data": {"message": "no"}}})
        ),
        Ending.PROTOCOL_ERROR,
    ),
    (
        "opencode",
        HarnessExit(0, lines({"type": "step_finish", "part": {"reason": "tool-calls"}})),
        Ending.FINISHED,
    ),
    ("openhands", HarnessExit(0, "Agent finished\nGoodbye!\n"), Ending.FINISHED),
    (
        "openhands",
        HarnessExit(0, lines({"kind": "ConversationErrorEvent", "detail": "BadRequestError"})),
        Ending.PROTOCOL_ERROR,
    ),
]


@pytest.mark.parametrize(("name", "exit", "ending"), CASES)
def test_outcome(name: str, exit: HarnessExit, ending: Ending) -> None:
    outcome = adapters()[name].classify(CTX, exit)

    assert outcome.ending is ending, outcome
    assert KEY not in outcome.detail
