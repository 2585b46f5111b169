"""Conversation lineages of a rollout: which earlier answer a new request continues, if any.

Every answered call of a token-in rollout leaves an `AnsweredTurn`: its prompt ids, the ids it
sampled, and fingerprints of its messages and of the assistant message it served. A new request
continues a turn when its messages are exactly that turn's messages, then an assistant message
equal in substance to the one served (same text up to surrounding whitespace, same tool calls
with equal arguments; reasoning and call ids may be dropped or changed), then only new tool
and user messages. Turns are found by a hash over the message prefix, so conversations running
side by side under one key (sub-agents, title calls) each find their own and never another's.

When no turn is continued, `find` says why, by reason code: every code but `first_turn` and
`answer_dropped` is a break of the conversation's token chain (analysis/bridging.py counts them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from ...analysis.bridging import ANSWER_DROPPED, FIRST_TURN

# FIRST_TURN: the request continues no conversation this proxy has seen (a new one, a side
# call); ANSWER_DROPPED: it is an earlier request plus new messages, without the answer that
# request got (mini-swe-agent drops an answer it cannot parse and asks again); BRIDGED: it
# continues an answer. The rest are fallbacks that break a conversation's chain.
HISTORY_EDITED = "history_edited"
"""The request shares a beginning with a known conversation but not a whole earlier request
(compaction, an edited or dropped message)."""
ASSISTANT_REWRITTEN = "assistant_rewritten"
"""The earlier request matches, but the assistant message sent back is not the one served."""
TAIL_UNSUPPORTED = "tail_unsupported"
"""After the served answer come messages other than tool results and user turns, or none."""
TRUNCATED = "truncated"
"""The answer being continued was cut at its token limit, and the chat template writes no token
after an answer to end its turn with (a cut answer is bridged after the template's end of turn
where it has one, bridge.py)."""
NO_STOP_TOKEN = "no_stop_token"
"""The answer being continued did not end in a token the chat template ends a turn with, and
the template writes none after an answer."""
TOOLS_CHANGED = "tools_changed"
"""The tools or template options differ from the continued request's (they render elsewhere)."""
MULTIMODAL = "multimodal"
"""A message holds non-text content, which a token prompt cannot carry."""
TEMPLATE_MISMATCH = "template_mismatch"
"""The chat template does not render new messages as an extension of the conversation."""
MULTIPLE_CHOICES = "multiple_choices"
"""`n` > 1: several answers cannot all be continued by one lineage."""
UNSUPPORTED_BACKEND = "unsupported_backend"
"""The backend has no token-in route (a plain OpenAI-compatible server)."""
TOKENIZE_FAILED = "tokenize_failed"
"""The engine's /tokenize could not render the bridge."""
ENGINE_RENDERED = "engine_rendered"
"""Sent by the chat route with its prompt ids, the call was sampled from another prompt: the
engine ignored the ids and rendered the messages (a vLLM before 0.33, say)."""


_TAIL_ROLES = frozenset({"tool", "user"})
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


@dataclass(frozen=True)
class AnsweredTurn:
    """One answered call of a lineage."""

    prompt_ids: list[int]
    sampled_ids: list[int]
    finish_reason: str | None
    answer: bytes
    """The served assistant message's fingerprint (`answer_print`)."""
    context: bytes
    """Fingerprint of what renders besides the messages: tools, template options."""


@dataclass(frozen=True)
class Continued:
    turn: AnsweredTurn
    tail: list[dict[str, Any]]
    """The messages after the served answer: what the bridge renders."""


def _digest(prev: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(prev + data, digest_size=16).digest()


def prefix_hashes(messages: list[dict[str, Any]]) -> list[bytes]:
    """h[i]: the hash of messages[:i] (h[0] is the empty conversation's)."""
    hashes = [b""]
    for message in messages:
        hashes.append(_digest(hashes[-1], orjson.dumps(message, option=orjson.OPT_SORT_KEYS)))
    return hashes


def context_print(body: dict[str, Any]) -> bytes:
    """What the template renders besides the messages, fingerprinted."""
    rendered = {k: body.get(k) for k in ("tools", "chat_template_kwargs", "model")}
    return _digest(b"", orjson.dumps(rendered, option=orjson.OPT_SORT_KEYS))


def answer_print(message: dict[str, Any]) -> bytes:
    """An assistant message in substance: its text (stripped) and its calls' names and
    arguments (parsed, so re-spelled JSON is the same call). Reasoning and ids are left out:
    harnesses drop or re-mint them, and the engine's own ids carry them in token-in."""
    calls: list[Any] = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            calls.append(None)
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        calls.append([function.get("name"), arguments])
    text = _text(message.get("content"))
    return _digest(
        b"", orjson.dumps([text.strip() if text else "", calls], option=orjson.OPT_SORT_KEYS)
    )


def _text(content: object) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") in _TEXT_PARTS
        )
    return None


def multimodal(messages: list[dict[str, Any]]) -> bool:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(
            not (isinstance(p, str) or (isinstance(p, dict) and p.get("type") in _TEXT_PARTS))
            for p in content
        ):
            return True
    return False


def last_assistant(messages: list[dict[str, Any]]) -> int | None:
    """The index of the last assistant message: the answer a request may continue."""
    return next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"),
        None,
    )


class Lineages:
    """A rollout's recent turns, found by the hash of the messages they answered."""

    def __init__(self, keep: int = 64, known: int = 4096) -> None:
        self._turns: OrderedDict[bytes, list[AnsweredTurn]] = OrderedDict()
        self._keep = keep
        self._known: OrderedDict[bytes, None] = OrderedDict()
        """Prefix hashes of requests answered: a request sharing one is no new conversation."""
        self._known_size = known

    def find(
        self, messages: list[dict[str, Any]], hashes: list[bytes], context: bytes
    ) -> Continued | str:
        """The turn the request continues, or the reason code why there is none."""
        if multimodal(messages):
            return MULTIMODAL
        last = last_assistant(messages)
        if last is None:
            # A whole earlier request leads this one: its answer was left out.
            dropped = any(h in self._turns for h in hashes[1:-1])
            return ANSWER_DROPPED if dropped else FIRST_TURN
        turns = self._turns.get(hashes[last])
        if not turns:
            known = any(h in self._known for h in hashes[1 : last + 1])
            return HISTORY_EDITED if known else FIRST_TURN
        served = answer_print(messages[last])
        turn = next((t for t in reversed(turns) if t.answer == served), None)
        if turn is None:
            return ASSISTANT_REWRITTEN
        tail = messages[last + 1 :]
        if not tail or any(m.get("role") not in _TAIL_ROLES for m in tail):
            return TAIL_UNSUPPORTED
        if turn.context != context:
            return TOOLS_CHANGED
        return Continued(turn, tail)

    def add(self, hashes: list[bytes], turn: AnsweredTurn) -> None:
        """Remember an answered request (`hashes`: its prefix_hashes)."""
        key = hashes[-1]
        same = self._turns.setdefault(key, [])
        same.append(turn)
        del same[:-8]  # resampling one request keeps its latest answers
        self._turns.move_to_end(key)
        while len(self._turns) > self._keep:
            self._turns.popitem(last=False)
        for h in hashes[1:]:
            self._known[h] = None
            self._known.move_to_end(h)
        while len(self._known) > self._known_size:
            self._known.popitem(last=False)
