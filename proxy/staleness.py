"""A batch's bound on staleness, held where each call of a rollout is dispatched (the check:
control/stale_hold.py).

A rollout is `gap` weight updates behind when the version its oldest recorded answer was
sampled with was committed `gap` updates before the version in force: the hold's order of
commits (WeightHold.epoch_of), counted as the rollout service counts a finished sample's staleness
(runner/service/clock.py, groups.py), so the two agree; a rollout with no answer recorded yet is
behind nothing. The rollout service puts the bound in each
rollout's meta, `{"staleness": {"max_staleness": N, "stale": "flag" | "drop" | "relaunch"}}`,
and the proxy checks it whenever the hold lets one of the rollout's calls go to an engine: a new
call, or the continuation of one an abort_resume update cut. Past the bound:

- flag: the call goes on; meta["stale"] records the first gap found past it;
- drop: the call is refused (403 `rollout_stale`, in the client's dialect, as every refusal is)
  and the rollout ends cancelled, meta["stale"] saying so and at which gap;
- relaunch: the same, and the rollout service runs the sample again as a new attempt, which
  starts on the weights then in force (runner/service/scheduler.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BOUND = "staleness"
"""Meta key: the bound the rollout's batch set."""
MARK = "stale"
"""Meta key: what the bound did to the rollout, and at which gap."""


class StalePolicy(enum.StrEnum):
    DROP = "drop"
    """The rollout's next call is refused and it ends; its group is dropped as stale."""
    FLAG = "flag"
    """Its calls go on; the rollout and its sample are marked stale."""
    RELAUNCH = "relaunch"
    """Its next call is refused, it ends, and its sample runs again as a new attempt."""


ENDS_ROLLOUT = frozenset({StalePolicy.DROP, StalePolicy.RELAUNCH})


@dataclass(frozen=True)
class StaleBound:
    max_staleness: int
    policy: StalePolicy

    def as_meta(self) -> dict[str, Any]:
        return {"max_staleness": self.max_staleness, "stale": self.policy.value}


def rollout_bound(meta: Mapping[str, Any]) -> StaleBound | None:
    """The bound in a rollout's meta, or None (no bound, or one this proxy cannot read)."""
    found = meta.get(BOUND)
    if not isinstance(found, dict):
        return None
    limit, policy = found.get("max_staleness"), found.get("stale")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        return None
    if policy not in {p.value for p in StalePolicy}:
        return None
    return StaleBound(limit, StalePolicy(policy))


def stale_mark(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the bound did to a rollout (meta["stale"]), or None."""
    found = meta.get(MARK)
    return found if isinstance(found, dict) else None


def ended_stale(meta: Mapping[str, Any], policy: StalePolicy | None = None) -> bool:
    """Whether the bound ended the rollout (dropped or relaunched; `policy`: that one only)."""
    mark = stale_mark(meta)
    if mark is None:
        return False
    action = mark.get("action")
    return action in ENDS_ROLLOUT if policy is None else action == policy.value
