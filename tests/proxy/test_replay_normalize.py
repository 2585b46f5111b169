"""The replay's request normalization and message-level diff, rule by rule."""

from __future__ import annotations

from typing import Any

import pytest

from rolltap.proxy.replay.diff import conversation, divergence
from rolltap.proxy.replay.normalize import Normalizer
from rolltap.store import CallDialect

ULID = "01M84R74A42GF1J1JF4J59AE4K"


@pytest.mark.parametrize(
    ("original", "replayed"),
    [
        ("sig rt1.AbC-_0123xyz== end", "sig rt1.ZZZ999-_ end"),
        (f"resp_{ULID}", "resp_01M84R7PMF5XX27P1PB8PZCGBS"),
        (f"toolu_{ULID}_0", "toolu_01M84R7PMF5XX27P1PB8PZCGBS_0"),
        ("key rk-" + "a" * 32, "key rk-" + "B" * 32),
        ("/boxes/batch-a/x/fs/app", "/boxes/replay-b-1/x/fs/app"),
        (
            "x-anthropic-billing-header: cc_version=2.1; cch=4f2a;\nYou are Claude Code.",
            "x-anthropic-billing-header: cc_version=2.1; cch=9e01;\nYou are Claude Code.",
        ),
        (
            "Chunk ID: 976812\nWall time: 0.0012 seconds\nOutput:\nhi",
            "Chunk ID: db792c\nWall time: 0.3000 seconds\nOutput:\nhi",
        ),
    ],
)
def test_volatile_strings_compare_equal(original: str, replayed: str) -> None:
    normalize = Normalizer(["batch-a", "replay-b-1"])
    assert normalize.text(original) == normalize.text(replayed)


@pytest.mark.parametrize(
    ("original", "replayed"),
    [
        ("output: 1784627348", "output: 2692432919"),
        ("Wall time is 3 seconds", "Wall time is 4 seconds"),  # not Codex's header line
        ("date: 2026-11-21 10:00:01", "date: 2026-11-21 10:00:02"),
        ("550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440001"),
        ("lowercase 01m84r74a42gf1j1jf4j59ae4k", "lowercase 01m84r7pmf5xx27p1pb8pzcgbs"),
    ],
)
def test_everything_else_is_compared(original: str, replayed: str) -> None:
    normalize = Normalizer(["batch-a"])
    assert normalize.text(original) != normalize.text(replayed)


def test_volatile_fields_are_blanked_and_cache_markers_dropped() -> None:
    def body(session: str, item: str, cached: bool) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "text", "text": "go"}
        if cached:
            block["cache_control"] = {"type": "ephemeral"}
        return {
            "metadata": {"user_id": session},
            "prompt_cache_key": session,
            "client_metadata": {"turn_id": session},
            "input": [{"id": item, "type": "message", "content": [block]}],
        }

    normalize = Normalizer()
    assert normalize.body(body("s1", "msg_1", True)) == normalize.body(body("s2", "msg_2", False))
    assert normalize.body({"id": 7}) == {"id": 7}  # only string ids are identities


def test_a_changed_tool_output_is_one_changed_message() -> None:
    def request(output: str) -> dict[str, Any]:
        return {
            "model": "m",
            "messages": [
                {"role": "user", "content": "roll"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                {"role": "tool", "tool_call_id": "c1", "content": f"rolled\n{output}\nok"},
            ],
        }

    found = divergence(request("17"), request("42"), CallDialect.CHAT)

    assert found is not None
    assert found.params == []
    (change,) = found.messages
    assert (change.kind, change.index, change.role) == ("changed", 2, "tool")
    assert [d for d in change.diff if d[:1] in "-+"] == ["-  17", "+  42"]
    assert found.summary == "message 2 (tool) changed: -  17 / +  42"
    assert divergence(request("17"), request("17"), CallDialect.CHAT) is None


def test_an_inserted_message_is_added_not_a_cascade() -> None:
    old = {"messages": [{"role": "user", "content": c} for c in "abcd"]}
    new = {"messages": [{"role": "user", "content": c} for c in "abXcd"]}

    found = divergence(old, new, CallDialect.CHAT)

    assert found is not None
    assert [(c.kind, c.index) for c in found.messages] == [("added", 2)]


def test_parameters_are_compared_apart_from_the_conversation() -> None:
    old = {"model": "m", "temperature": 1.0, "system": "s", "messages": []}
    new = {"model": "m", "temperature": 0.5, "system": "s", "messages": []}

    found = divergence(old, new, CallDialect.MESSAGES)

    assert found is not None
    assert (found.params, found.messages) == (["temperature"], [])
    assert found.summary == "request fields differ: temperature"


@pytest.mark.parametrize(
    ("dialect", "body", "roles"),
    [
        (CallDialect.CHAT, {"messages": [{"role": "user"}]}, ["user"]),
        (CallDialect.RESPONSES, {"instructions": "i", "input": "hi"}, ["instructions", "user"]),
        (
            CallDialect.RESPONSES,
            {"input": [{"type": "function_call_output", "call_id": "c"}]},
            ["function_call_output"],
        ),
        (CallDialect.MESSAGES, {"system": "s", "messages": [{"role": "user"}]}, ["system", "user"]),
    ],
)
def test_each_dialects_conversation(
    dialect: CallDialect, body: dict[str, Any], roles: list[str]
) -> None:
    messages, params = conversation(body, dialect)
    assert [m.get("role") or m.get("type") for m in messages] == roles
    assert params == {}
