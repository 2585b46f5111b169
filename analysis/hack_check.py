"""A stored rollout's reward-hack check, run now: its record read through the store, the chosen
detectors run on it, and (when asked) their flags written back to the rollout."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .choice import load_detectors
from .hacks import Detector, HackFlag, detect, hack_record

if TYPE_CHECKING:
    from ..store.store import Store


async def check_hacks(
    store: Store,
    rollout_id: str,
    detectors: Sequence[Detector] | None = None,
    *,
    save: bool = False,
) -> list[HackFlag]:
    """Runs the detectors (default: `choice.load_detectors()`) on the rollout's record now;
    `save`: store the flags as the rollout's `hack_flags` (sealed into an ended rollout's
    head)."""
    record = await hack_record(store, rollout_id)
    chosen = load_detectors() if detectors is None else detectors
    found = await asyncio.to_thread(detect, record, chosen)
    if save:
        await store.update_rollout(rollout_id, hack_flags=found)
    return found
