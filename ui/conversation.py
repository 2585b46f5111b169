"""Each call's messages as the harness sent them, and what it got back, in any dialect.

The recorded request bodies are reduced to turns (`rolltap.analysis.turns`: chat, Responses and
Messages alike). A harness resends its whole history every call, so a call shows only what is
new on its line since the previous call of that line (that call's request plus the answer it
received), and where the harness changed that history instead of extending it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..analysis.drift import first_difference
from ..analysis.turns import ConversationTurn, request_turns, response_turns
from ..store import CallBodies, CallView


@dataclass(frozen=True)
class Edit:
    index: int
    note: str
    kind: str
    before: ConversationTurn | None
    """The message the harness had sent or received at `index` before, when there was one."""


@dataclass(frozen=True)
class Exchange:
    call: CallView
    sent: list[ConversationTurn] | None
    """Every turn of the request; None when the body is missing or not understood."""
    new_from: int
    """Turns before this index repeat the line's previous call exactly."""
    edit: Edit | None
    answers: list[list[ConversationTurn]]
    """What the client received, per choice."""

    @property
    def new(self) -> list[tuple[int, ConversationTurn]]:
        return [] if self.sent is None else list(enumerate(self.sent))[self.new_from :]


def exchanges(calls: Sequence[CallView], bodies: Mapping[str, CallBodies]) -> list[Exchange]:
    previous: dict[str | None, list[ConversationTurn]] = {}
    out = []
    for call in calls:
        alone = exchange(call, bodies.get(call.id))
        line = call.purpose or None
        before = previous.get(line)
        sent = alone.sent
        if sent is None:
            out.append(alone)
            continue
        new_from, edit = 0, None
        if before is not None:
            difference = first_difference(before, sent)
            if difference is None:
                new_from = len(before)
            else:
                index, kind, note = difference
                new_from = index
                was = before[index] if index < len(before) else None
                edit = Edit(index, note, kind.value, was)
        previous[line] = sent + (alone.answers[0] if alone.answers else [])
        out.append(Exchange(call, sent, new_from, edit, alone.answers))
    return out


def exchange(call: CallView, body: CallBodies | None) -> Exchange:
    """One call on its own: every turn it sent counts as new."""
    sent = None if body is None else request_turns(call.dialect, body.request)
    answers = []
    for choice in range(max(1, call.n_choices)):
        got = None if body is None else response_turns(call.dialect, body.response, choice)
        if got:
            answers.append(got)
    return Exchange(call, sent, 0, None, answers)
