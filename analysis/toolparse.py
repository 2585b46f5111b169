"""How often answers' tool calls failed to parse: `malformed_call_rate`.

Every answer whose tool calls rolltap or its built-in engine parsed records the outcome
(`call.tool_parse`, chatformat/tools.py `parse_outcome`): `ok` (every call it wrote parsed),
`malformed: <reason>` (one did not: its text went to the client as content; the reason names
it `tool call N`, the Nth call the answer wrote), `none` (it wrote no call). None: nothing
parsed the answer's calls (vLLM and SGLang parse their own and say nothing of it). The rate
is malformed answers over answers that wrote calls: a model, template or parser that garbles
calls shows here instead of as a reward that quietly drops.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

OK = "ok"
MALFORMED = "malformed"
NONE = "none"


# Outcomes recorded before the reason said `tool call N` said `call N`, which beside the
# rollout's own call numbers reads as the rollout's Nth call.
_OLD_INDEX = re.compile(r"\Acall (?=\d+: )")


def kind(outcome: str) -> str:
    """`ok`, `malformed` or `none` (a malformed outcome without its reason)."""
    return MALFORMED if outcome.startswith(MALFORMED) else outcome


def reason_of(outcome: str | None) -> str | None:
    """A malformed outcome's reason (`tool call 1: no name`), from records of any age; None
    for any other outcome."""
    if outcome is None or kind(outcome) != MALFORMED:
        return None
    reason = outcome.partition(":")[2].strip()
    return _OLD_INDEX.sub("tool call ", reason)


@dataclass(frozen=True)
class ToolParsing:
    """The parse outcomes of some answers (a rollout's, a batch's)."""

    ok: int = 0
    malformed: int = 0
    none: int = 0
    reasons: tuple[str, ...] = ()
    """The malformed answers' reasons, up to 5."""

    @classmethod
    def of(cls, outcomes: Iterable[str | None]) -> ToolParsing | None:
        """From each call's `tool_parse`; None when no answer's calls were parsed."""
        counts = {OK: 0, MALFORMED: 0, NONE: 0}
        reasons: list[str] = []
        for outcome in outcomes:
            if outcome is None:
                continue
            found = kind(outcome)
            counts[found] = counts.get(found, 0) + 1
            reason = reason_of(outcome)
            if reason is not None and len(reasons) < 5:
                reasons.append(reason)
        if not any(counts.values()):
            return None
        return cls(counts[OK], counts[MALFORMED], counts[NONE], tuple(reasons))

    @property
    def malformed_call_rate(self) -> float | None:
        """Malformed answers over answers that wrote calls; None when none did."""
        wrote = self.ok + self.malformed
        return self.malformed / wrote if wrote else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "answers": self.ok + self.malformed + self.none,
            "ok": self.ok,
            "malformed": self.malformed,
            "none": self.none,
            "malformed_call_rate": self.malformed_call_rate,
            "reasons": list(self.reasons),
        }
