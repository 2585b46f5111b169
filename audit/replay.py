"""A replay's report: how a rollout ran again against its own recorded answers (`rolltap replay`).

The report is stored as the replay rollout's `meta["replay"]`, and the original rollout lists
its replays in `meta["replays"]`; `replay_report(store, id)` reads either way, so the CLI, the admin
API (`GET /admin/rollouts/{id}/replay`) and the web viewer show the same thing. The proxy's
cassette (rolltap.proxy.replay) produces the per-call part.

Per call, `outcome` is one of:
- `matched`: the request equals the recorded one after normalization; the recorded answer
  was served;
- `diverged`: it differs; `changes` says how, message by message. What was served follows the
  mode: the recorded answer (a plain replay), a refusal (`--until-divergence`), or the engine
  (`--continue-live`, `served: live`);
- `extra`: the harness made a call the record does not have;
- `missing`: a recorded call the replay never made (the harness stopped earlier);
- `live`: made after the switch to the engine (`--continue-live`), not compared;
- `stopped`: made after `--until-divergence` stopped the replay, refused.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..store.errors import NotFound

if TYPE_CHECKING:
    from ..store.store import Store

REPORT_KEY = "replay"
"""The replay rollout's meta key holding its report."""
REPLAY_OF = "replay_of"
"""The replay rollout's meta key naming the original."""
REPLAYS = "replays"
"""The original rollout's meta key listing its replays, oldest first."""


class Outcome(enum.StrEnum):
    MATCHED = "matched"
    DIVERGED = "diverged"
    EXTRA = "extra"
    MISSING = "missing"
    LIVE = "live"
    STOPPED = "stopped"


class Served(enum.StrEnum):
    RECORDED = "recorded"
    LIVE = "live"
    REFUSED = "refused"
    NOTHING = "nothing"


class Mode(enum.StrEnum):
    REPLAY = "replay"
    UNTIL_DIVERGENCE = "until-divergence"
    CONTINUE_LIVE = "continue-live"


@dataclass(frozen=True)
class MessageChange:
    """One message of the request that the replay sent differently."""

    kind: str
    """`changed`, `added` (only in the replay) or `removed` (only in the record)."""
    index: int
    """Its position in the replayed request (in the recorded one for `removed`)."""
    role: str
    diff: list[str]
    """Unified diff lines, recorded (-) against replayed (+), of the message as text."""


@dataclass(frozen=True)
class Divergence:
    params: list[str] = field(default_factory=list)
    """Request fields other than the messages whose values differ (tools, model, sampling)."""
    messages: list[MessageChange] = field(default_factory=list)
    summary: str = ""
    """One line: what differs first."""


@dataclass(frozen=True)
class CallReplay:
    position: int
    """1-based order in which the replay made it (recorded order for `missing`)."""
    lane: str
    """`main`, or the side-call purpose it was matched within (title, compaction, ...)."""
    outcome: Outcome
    served: Served
    recorded_call: str | None = None
    recorded_seq: int | None = None
    replay_call: str | None = None
    divergence: Divergence | None = None


@dataclass(frozen=True)
class ReplayReport:
    original: str
    replay: str
    mode: Mode
    calls: list[CallReplay]
    recorded_reward: float | None
    replayed_reward: float | None
    recorded_status: str
    replayed_status: str
    normalization: str
    """The version of the request normalization compared under (rolltap.proxy.replay)."""
    notes: list[str] = field(default_factory=list)
    """What else differed: the harness version, the sandbox kind, a changed task."""
    live_from: int | None = None
    """--continue-live: the position of the first call the engine answered; from there on the
    replay rollout is a counterfactual continuation."""

    @property
    def first_divergence(self) -> CallReplay | None:
        bad = (Outcome.DIVERGED, Outcome.EXTRA, Outcome.MISSING)
        return next((c for c in self.calls if c.outcome in bad), None)

    @property
    def same_reward(self) -> bool:
        return self.recorded_reward == self.replayed_reward

    @property
    def reproduced(self) -> bool:
        """Every call matched, none extra or missing, and the same reward."""
        return self.first_divergence is None and self.same_reward

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["first_divergence"] = (
            None if self.first_divergence is None else self.first_divergence.position
        )
        data["reproduced"] = self.reproduced
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayReport:
        calls = [_call(c) for c in data.get("calls") or ()]
        return cls(
            original=str(data["original"]),
            replay=str(data["replay"]),
            mode=Mode(data["mode"]),
            calls=calls,
            recorded_reward=data.get("recorded_reward"),
            replayed_reward=data.get("replayed_reward"),
            recorded_status=str(data.get("recorded_status") or ""),
            replayed_status=str(data.get("replayed_status") or ""),
            normalization=str(data.get("normalization") or ""),
            notes=list(data.get("notes") or ()),
            live_from=data.get("live_from"),
        )


def _call(data: dict[str, Any]) -> CallReplay:
    divergence = data.get("divergence")
    return CallReplay(
        position=int(data["position"]),
        lane=str(data["lane"]),
        outcome=Outcome(data["outcome"]),
        served=Served(data["served"]),
        recorded_call=data.get("recorded_call"),
        recorded_seq=data.get("recorded_seq"),
        replay_call=data.get("replay_call"),
        divergence=None if divergence is None else _divergence(divergence),
    )


def _divergence(data: dict[str, Any]) -> Divergence:
    return Divergence(
        params=list(data.get("params") or ()),
        messages=[MessageChange(**m) for m in data.get("messages") or ()],
        summary=str(data.get("summary") or ""),
    )


def report_of(meta: dict[str, Any]) -> ReplayReport | None:
    """The report a replay rollout's meta holds, if it is one (and it has finished)."""
    data = meta.get(REPORT_KEY)
    return ReplayReport.from_json(data) if isinstance(data, dict) else None


async def replay_report(store: Store, rollout_id: str) -> ReplayReport | None:
    """The report of a replay rollout, or of an original's latest replay; None when it has none
    (yet)."""
    view = await store.rollout(rollout_id)
    report = report_of(view.meta)
    replays = view.meta.get(REPLAYS)
    if report is None and isinstance(replays, list) and replays:
        try:
            report = report_of((await store.rollout(str(replays[-1]))).meta)
        except NotFound:
            return None  # a replay listed but not in this database (an export, a copy)
    return report
