"""The reward-hack flags a rollout row holds (`rollout.hack_flags`): their typed record and the
JSON list they are stored as. The detectors that raise them are analysis/hacks.py's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HackFlag:
    detector: str
    reason: str
    """One line: what the agent did that earns reward without solving the task."""
    call_id: str | None = None
    """The call that carried it (None: found in egress records or timing alone)."""
    seq: int | None = None
    command: str | None = None
    """The command, path or URL that raised it, as the agent sent it."""
    source: str = "tool_call"
    """Where it was seen: tool_call, tool_result, egress or timing."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "detector": self.detector,
            "reason": self.reason,
            "call_id": self.call_id,
            "seq": self.seq,
            "command": self.command,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HackFlag:
        seq = data.get("seq")
        return cls(
            detector=str(data.get("detector")),
            reason=str(data.get("reason") or ""),
            call_id=data.get("call_id"),
            seq=int(seq) if isinstance(seq, int) else None,
            command=data.get("command"),
            source=str(data.get("source") or "tool_call"),
        )

    def line(self) -> str:
        """One line for a terminal: where, which detector, why, what."""
        where = f"seq {self.seq}" if self.seq is not None else self.source
        command = f": {self.command}" if self.command else ""
        return f"{self.detector} ({where}) {self.reason}{command}"


def flags_of(stored: Any) -> list[HackFlag] | None:
    """The flags a rollout row holds (None: never checked)."""
    if not isinstance(stored, list):
        return None
    return [HackFlag.from_dict(f) for f in stored if isinstance(f, dict)]


def as_stored(flags: Iterable[HackFlag | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Flags as the rollout row keeps them (a list of `HackFlag.as_dict()`)."""
    return [(f if isinstance(f, HackFlag) else HackFlag.from_dict(f)).as_dict() for f in flags]
