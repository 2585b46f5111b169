"""How often token-in calls continued their conversation's ids: `bridge_break_rate`.

Each call of a token-in rollout records `bridged` or the reason code of its fallback
(proxy/tokenin/lineage.py). A first turn (a new conversation, a side call) breaks nothing, nor
does a harness asking again without the answer it dropped (a new chain from an earlier
request); any other fallback breaks a conversation's token chain. The rate is breaks over the
calls that continue a conversation: bridged calls and breaks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

BRIDGED = "bridged"
FIRST_TURN = "first_turn"
ANSWER_DROPPED = "answer_dropped"
NEW_CHAINS = frozenset({FIRST_TURN, ANSWER_DROPPED})
"""Fallbacks that start a chain rather than break one."""


def break_rate(outcomes: Mapping[str, float]) -> float | None:
    """Breaks over calls that continue a conversation; None when no call did."""
    breaks = sum(
        n for outcome, n in outcomes.items() if outcome != BRIDGED and outcome not in NEW_CHAINS
    )
    continuing = breaks + outcomes.get(BRIDGED, 0)
    return breaks / continuing if continuing else None


@dataclass(frozen=True)
class Bridging:
    """The token-in outcomes of some calls (a rollout's, a batch's)."""

    outcomes: dict[str, int]
    """`bridged` or a fallback's reason code -> calls."""

    @classmethod
    def of(cls, outcomes: Iterable[str | None]) -> Bridging | None:
        """From each call's `bridge` (None: a call in normal mode); None without token-in calls."""
        counts: dict[str, int] = {}
        for outcome in outcomes:
            if outcome is not None:
                counts[outcome] = counts.get(outcome, 0) + 1
        return cls(counts) if counts else None

    @property
    def bridge_break_rate(self) -> float | None:
        return break_rate(self.outcomes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": sum(self.outcomes.values()),
            "bridged": self.outcomes.get(BRIDGED, 0),
            "bridge_break_rate": self.bridge_break_rate,
            "outcomes": dict(sorted(self.outcomes.items())),
        }
