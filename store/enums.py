"""The values the store's tables hold for statuses, dialects and verdicts, as enums.

Apart from the tables (store/models.py) so that reading rows (`rolltap ls`, the views in
store/records.py) does not load SQLAlchemy's ORM to name them.
"""

from __future__ import annotations

import enum


class RolloutStatus(enum.StrEnum):
    """How a rollout's run ended: its harness and verifier, not whether the task passed (that
    is its reward, read as a `Verdict`)."""

    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    """The harness ended on its own and the verifier gave a reward (which may be 0)."""
    FAILED = "failed"
    """The harness or the verifier broke (an infrastructure or protocol failure)."""
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"
    EXPIRED = "expired"
    """Nobody finished it: no call for the proxy's idle expiry (a rollout made by hand)."""
    SUCCEEDED = "finished"
    """The old name of FINISHED ("succeeded" read as "passed"); the value is FINISHED's."""

    @classmethod
    def _missing_(cls, value: object) -> RolloutStatus | None:
        # Stores migrated from "succeeded", and clients that still send it, mean FINISHED.
        return cls.FINISHED if value == "succeeded" else None


class Verdict(enum.StrEnum):
    """Whether the task passed, from the verifier's reward (docs/training.md)."""

    PASSED = "passed"
    """reward >= 1.0"""
    PARTIAL = "partial"
    """0 < reward < 1"""
    FAILED = "failed"
    """reward <= 0"""
    UNVERIFIED = "unverified"
    """No reward: the verifier did not run (or the rollout has not ended)."""

    @classmethod
    def of(cls, reward: float | None, pass_reward: float = 1.0) -> Verdict:
        if reward is None or reward != reward:  # NaN: no verdict either
            return cls.UNVERIFIED
        if reward >= pass_reward:
            return cls.PASSED
        return cls.PARTIAL if reward > 0 else cls.FAILED


class CallStatus(enum.StrEnum):
    OK = "ok"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


class CallDialect(enum.StrEnum):
    CHAT = "chat"
    RESPONSES = "responses"
    MESSAGES = "messages"
    COMPLETIONS = "completions"


class Capture(enum.StrEnum):
    TOKENS = "tokens"
    """The engine returned the ids it sampled: the call is token-faithful."""
    TEXT = "text"
    """The backend returned text only; never presented as token-faithful."""
    NONE = "none"
    """Nothing was sampled (rejected, or failed before the engine answered)."""


class EgressVerdict(enum.StrEnum):
    ALLOWED = "allowed"
    DENIED = "denied"
    INTERCEPTED = "intercepted"
    """An LLM API host's call, routed into the rollout's proxy endpoint (recorded as a call)."""


class LinkKind(enum.StrEnum):
    BREAK = "break"
    """The same line carried on, but its prompt did not extend what came before: drift."""
    SIDE = "side"
    """A side call (title, summary, sub-agent) branching off the line it shares a prefix with."""
    SIBLING = "sibling"
    """Another choice of an `n > 1` call."""


class DriftClass(enum.StrEnum):
    RETOKENIZATION = "retokenization"
    """The same text came back as different ids."""
    REASONING_STRIPPED = "reasoning_stripped"
    """Sampled reasoning (`<think>`) was left out of the later context."""
    REASONING_INSERTED = "reasoning_inserted"
    """Reasoning markup the model did not sample was put into the later context."""
    TOOL_ARGS = "tool_args_reserialized"
    """The same tool-call arguments came back serialised differently."""
    HISTORY_EDITED = "history_edited"
    """The harness dropped, inserted or changed messages (compaction, reminders, truncation)."""
    ANSWER_DROPPED = "answer_dropped"
    """The harness asked again without the answer it got (it rejected it: a format error, no
    tool call): the name token-in mode gives the same event (analysis/bridging.py)."""
    TEMPLATE_GLUE = "template_glue"
    """The template rendered the same messages differently: separators, whitespace, specials."""
    TEXT_ONLY = "text_only"
    """A call without token ids sat between: the chain cannot be carried through it."""
    OTHER = "other"
