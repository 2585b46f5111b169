"""Makes each call durable and counts it against its rollout: the one place a call is recorded."""

from __future__ import annotations

from ..analysis.toolparse import kind
from ..store import CallStatus, RolloutStatus, Store
from ..store.events import Started
from ..store.lifecycle import status_of
from .hold import WeightHold
from .metrics import ProxyMetrics
from .rollouts import RolloutState
from .upstream.exchange import Exchange


class Recorder:
    def __init__(self, store: Store, metrics: ProxyMetrics, hold: WeightHold) -> None:
        self._store = store
        self._metrics = metrics
        self._hold = hold

    async def record(self, exchange: Exchange, state: RolloutState) -> None:
        """Make the call durable, then count it against the rollout."""
        record = exchange.to_record()
        # Which weights served it, sealed into its digest (store/chain.py).
        record.weights_digest = self._hold.digest_of(record.weight_version)
        receipt = await self._store.append_call(record)
        if record.status is CallStatus.OK:
            state.saw_version(record.weight_version)  # staleness counts from it (staleness.py)
        if exchange.body_hash is not None:
            state.remember_body(exchange.body_hash, receipt.call_id, record.status.value)
        counted = record.status is not CallStatus.REJECTED
        state.budget.settle(exchange.call_id, counted=counted, tokens=exchange.tokens_used)
        if state.status is RolloutStatus.PENDING and counted:
            started = Started()
            state.status = status_of(started)
            await self._store.report(state.id, started)
        metrics = self._metrics
        metrics.calls.inc(dialect=exchange.dialect.value, status=record.status.value)
        metrics.tokens.inc(exchange.prompt_tokens, kind="prompt")
        metrics.tokens.inc(exchange.completion_tokens, kind="completion")
        if record.tool_parse is not None:
            metrics.tool_parse.inc(outcome=kind(record.tool_parse))
