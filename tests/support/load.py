"""Clients that keep a proxy busy in every dialect and remember what each answer looked like."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
ID_PREFIX = {"chat": "chatcmpl-", "responses": "resp_", "messages": "msg_"}


def request(dialect: str, content: str, stream: bool) -> dict[str, Any]:
    if dialect == "chat":
        return {"model": "m", "messages": [{"role": "user", "content": content}], "stream": stream}
    if dialect == "responses":
        return {"model": "m", "input": content, "stream": stream}
    messages = [{"role": "user", "content": content}]
    return {"model": "m", "max_tokens": 4096, "messages": messages, "stream": stream}


@dataclass
class Outcome:
    dialect: str
    stream: bool
    status: int | None = None
    call_id: str | None = None
    """The proxy's call id, read from the answer's own id."""
    text: str = ""
    complete: bool = False
    """The client got the whole answer: a finish_reason ([DONE] for one without),
    response.completed or message_stop."""
    error_event: bool = False
    """The stream ended with the dialect's error event."""
    broken: bool = False
    """The connection broke or the stream was cut without an ending."""


def read_stream(dialect: str, body: bytes, outcome: Outcome) -> None:
    """Fill `outcome` from an event stream; a stream cut short (a killed proxy) is `broken`."""
    events = body.split(b"\n\n")
    if events[-1]:
        outcome.broken = True  # cut inside an event
    for event in events[:-1]:
        name = None
        data = b""
        for line in event.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data = line[6:]
        if data == b"[DONE]":
            outcome.complete = True
            continue
        doc = orjson.loads(data)
        _read_event(dialect, name, doc, outcome)
    if not (outcome.complete or outcome.error_event):
        outcome.broken = True


def _read_event(dialect: str, name: str | None, doc: dict[str, Any], outcome: Outcome) -> None:
    if dialect == "chat":
        if "error" in doc:
            outcome.error_event = True
            return
        outcome.call_id = outcome.call_id or _call_id(dialect, doc.get("id"))
        for choice in doc.get("choices") or ():
            outcome.text += choice["delta"].get("content") or ""
            # Clients that stop reading at finish_reason take the answer as whole there.
            outcome.complete = outcome.complete or choice.get("finish_reason") is not None
    elif dialect == "responses":
        if name == "response.created":
            outcome.call_id = _call_id(dialect, doc["response"]["id"])
        elif name == "response.output_text.delta":
            outcome.text += doc["delta"]
        elif name == "response.completed":
            outcome.complete = True
        elif name == "response.failed":
            outcome.error_event = True
    else:
        if name == "message_start":
            outcome.call_id = _call_id(dialect, doc["message"]["id"])
        elif name == "content_block_delta" and doc["delta"]["type"] == "text_delta":
            outcome.text += doc["delta"]["text"]
        elif name == "message_stop":
            outcome.complete = True
        elif name == "error":
            outcome.error_event = True


def read_whole(dialect: str, doc: dict[str, Any], outcome: Outcome) -> None:
    outcome.call_id = _call_id(dialect, doc.get("id"))
    if dialect == "chat":
        outcome.text = doc["choices"][0]["message"]["content"] or ""
    elif dialect == "responses":
        outcome.text = "".join(
            part["text"]
            for item in doc["output"]
            if item["type"] == "message"
            for part in item["content"]
        )
    else:
        outcome.text = "".join(b["text"] for b in doc["content"] if b["type"] == "text")
    outcome.complete = True


def _call_id(dialect: str, answer_id: Any) -> str | None:
    prefix = ID_PREFIX[dialect]
    if isinstance(answer_id, str) and answer_id.startswith(prefix):
        return answer_id[len(prefix) :]
    return None


async def call(
    session: aiohttp.ClientSession, base: str, dialect: str, content: str, stream: bool
) -> Outcome:
    """One call; whatever happens to it ends up in the outcome, never as an exception."""
    outcome = Outcome(dialect, stream)
    body = b""
    try:
        async with session.post(base + PATHS[dialect], json=request(dialect, content, stream)) as r:
            outcome.status = r.status
            async for data in r.content.iter_any():
                body += data
    except (aiohttp.ClientError, ConnectionError):
        outcome.broken = True
    if outcome.status != 200:
        return outcome
    # What arrived before a break counts: a client may act on an answer's end before it.
    if stream:
        read_stream(dialect, body, outcome)
    elif not outcome.broken:
        read_whole(dialect, orjson.loads(body), outcome)
    return outcome


async def keep_calling(
    session: aiohttp.ClientSession,
    base: str,
    dialects: list[str],
    outcomes: list[Outcome],
    stop: asyncio.Event,
    content: str = "hello",
) -> None:
    """Calls back to back, cycling through the dialects, until `stop` is set."""
    for dialect in itertools.cycle(dialects):
        if stop.is_set():
            return
        outcome = await call(session, base, dialect, content, stream=True)
        outcomes.append(outcome)
        if not outcome.complete:
            # A fault hit: wait for the test to end the load rather than spin on refusals.
            await stop.wait()
            return
