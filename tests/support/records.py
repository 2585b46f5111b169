"""Building CallRecords in tests with as little noise as possible."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from rolltap.store import CallDialect, CallRecord, CallStatus, Capture, ChoiceRecord


def call(
    rollout_id: str,
    prompt: Sequence[int] | np.ndarray,
    *completions: Sequence[int] | np.ndarray,
    logprobs: Sequence[Sequence[float] | None] | None = None,
    status: CallStatus = CallStatus.OK,
    request_body: bytes | None = None,
    **fields: object,
) -> CallRecord:
    choices = []
    for i, ids in enumerate(completions):
        lp = None
        if logprobs is not None:
            lp = None if logprobs[i] is None else np.asarray(logprobs[i], dtype=np.float64)
        elif len(ids):
            lp = -np.linspace(0.01, 2.0, len(ids))
        choices.append(ChoiceRecord(i, np.asarray(ids), lp, "stop"))
    return CallRecord(
        rollout_id=rollout_id,
        dialect=CallDialect.CHAT,
        status=status,
        capture=Capture.TOKENS,
        received_at=datetime.now(UTC),
        prompt_ids=np.asarray(prompt),
        choices=choices,
        request_body=request_body,
        **fields,  # type: ignore[arg-type]
    )
