"""How a rollout's fields read in a terminal table (`rolltap ls`, `rolltap show`)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store import RolloutView


def task_label(r: RolloutView) -> str:
    if r.task_id is None:
        return "-"
    return r.task_id if r.sample_index is None else f"{r.task_id}#{r.sample_index}"


def when(t: datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S")
