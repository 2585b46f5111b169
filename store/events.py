"""What happens to a rollout, as its writers report it: the proxy, the runner, the rollout service,
a Ray driver, the admin API.

An event says what happened and carries what its reporter knows (a reward, an error's text,
details, metadata); it names no status. `Store.report(rollout_id, event)` hands it to the
rollout's life (store/lifecycle.py), which alone decides what it makes the rollout's status and
how the write meets what another writer did first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .enums import RolloutStatus

SUPERSEDED_BY = "superseded_by"
"""Metadata of an attempt replaced by a next one: that one's id."""


@dataclass(frozen=True)
class Started:
    """Its first counted call reached the proxy, or the runner started its harness."""


@dataclass(frozen=True)
class BudgetExceeded:
    """The proxy refused a call: the rollout's budget of calls or tokens is spent."""

    error: str


@dataclass(frozen=True)
class IdleExpired:
    """A rollout outside any batch had no call for the proxy's idle expiry and nobody ends it."""

    error: str


@dataclass(frozen=True)
class StaleMarked:
    """The proxy found the rollout past its batch's bound on staleness and lets it go on."""

    meta: Mapping[str, Any]
    """The mark, merged into its metadata while it has not ended."""


@dataclass(frozen=True)
class StaleDropped:
    """The proxy found the rollout past its batch's bound on staleness and stops it (dropped,
    or to run again as a new attempt)."""

    error: str
    meta: Mapping[str, Any]
    """The mark, merged into its metadata with the ending."""


@dataclass(frozen=True)
class HarnessEnded:
    """The runner's attempt is over: its harness ran (or could not: `failure`) and its verifier
    gave a reward (or could not: `verifier_failure`)."""

    reward: float | None = None
    details: Mapping[str, Any] | None = None
    """The reward's details: how the harness ended, its exit code, the verifier's values."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    """The harness was killed at its timeout."""
    failure: str | None = None
    """Why the harness ended otherwise than on its own (crashed, its setup or the machine
    failed); None when it ended on its own."""
    verifier_failure: str | None = None
    """Why the verifier gave no reward."""


@dataclass(frozen=True)
class AttemptLost:
    """The machine running the attempt was lost and no retry is left (a Ray node)."""

    error: str
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cancelled:
    """The batch running the rollout stopped (Ctrl-C, DELETE /v1/batches, its target kept)."""

    error: str


@dataclass(frozen=True)
class Superseded:
    """A next attempt (`by`) replaces this one, which will not finish (`why`)."""

    by: str
    why: str


@dataclass(frozen=True)
class Declared:
    """A client of the admin API (PATCH /admin/rollouts/{id}) says outright which status the
    rollout has; its life's diagram still applies."""

    status: RolloutStatus


Event = (
    Started
    | BudgetExceeded
    | IdleExpired
    | StaleMarked
    | StaleDropped
    | HarnessEnded
    | AttemptLost
    | Cancelled
    | Superseded
    | Declared
)
Ending = (
    BudgetExceeded
    | IdleExpired
    | StaleDropped
    | HarnessEnded
    | AttemptLost
    | Cancelled
    | Superseded
)
"""The events that always ask for an ending (kept only where the rollout has not ended)."""
