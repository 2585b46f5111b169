"""Rollouts as Harbor's ATIF `trajectory.json` (ATIF-v1.8), so Harbor's viewer and the tools that
read ATIF open rolltap rollouts.

ATIF-v1.8 is the newest version; token ids entered the step metrics in v1.3 (completion) and
v1.4 (prompt). The mapping, one rollout to one trajectory:

- `session_id` and `trajectory_id` are the rollout id; `agent` is the harness (name, the version
  recorded in `meta["run"]`, the model).
- Each LLM call the harness made is one `agent` step with `llm_call_count: 1`: the answer's text,
  reasoning and tool calls (choice 0), and `metrics` with the engine's exact
  `prompt_token_ids`, `completion_token_ids` and `logprobs` when the call captured them, and
  the MoE experts each of those tokens was routed to when they were captured (R3,
  store/routed.py) in `metrics.extra.routed_experts`: {dtype, shape, data}, data the base64 of
  the C-order little-endian array of shape [prompt + completion tokens - 1, layers, top-k] (or
  [..., layers * top-k] from SGLang), row i for token i of the prompt then the completion.
- What the harness sent that the previous call's conversation did not hold becomes steps before
  it: `system` and `user` steps, tool results as the `observation` of the agent step whose tool
  calls they answer (matched in order), and assistant turns the harness supplied itself as agent
  steps with `is_copied_context: true`. A harness that rewrote its history is noted on the step
  (`extra.rolltap.history_dropped`: how many earlier turns it no longer sent).
- Tool call ids are the call id and the call's index (`<call id>.<i>`): ids differ per dialect
  and some harnesses rewrite them, so they are rolltap's own.
- Calls without an answer (refused, failed), side calls (a `purpose`) and calls whose bodies are
  not understood are not steps; they are listed in `extra.rolltap.calls_not_steps`.
- `extra.rolltap` on the trajectory carries the rollout (batch, task, sample, status, reward,
  `head_hash`, `hack_flags`, `meta.run`); on each agent step, the call (id, seq, dialect, hash,
  finish reason, weight version) and the reward-hack flags that name it (`hack_flags`,
  analysis/hacks.py). A log probability of -inf (probability 0) is written as -3.4028235e38, the
  most
  negative float32: JSON has no infinities.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rolltap import __version__

from ..analysis.hacks import by_call
from ..analysis.turns import (
    ConversationTurn,
    ToolCall,
    parsed_arguments,
    request_turns,
    response_turns,
)
from ..store.errors import NotFound
from ..store.models import CallStatus, Capture
from ..store.packing import RoutingArray
from ..store.records import CallBodies, CallTokens, CallView, RolloutView
from ..store.routed import as_json
from ..store.store import Store

SCHEMA_VERSION = "ATIF-v1.8"
_LOG_ZERO = -3.4028234663852886e38


@dataclass(frozen=True)
class RolloutRecord:
    """Everything the conversion reads, loaded from the store."""

    rollout: RolloutView
    calls: Sequence[CallView]
    tokens: Mapping[str, CallTokens]
    bodies: Mapping[str, CallBodies]
    routing: Mapping[tuple[str, int], RoutingArray] = field(default_factory=dict)
    """(call id, choice) -> its routed experts (store/routed.py)."""


async def load(store: Store, rollout_id: str) -> RolloutRecord:
    rollout = await store.rollout(rollout_id)
    calls = await store.calls(rollout_id)
    bodies: dict[str, CallBodies] = {}
    for call in calls:
        try:
            bodies[call.id] = await store.call_bodies(call.id)
        except NotFound:
            continue  # recorded without bodies
    tokens = await store.rollout_tokens(rollout_id)
    return RolloutRecord(rollout, calls, tokens, bodies, await store.routed_experts(rollout_id))


async def rollout_atif(store: Store, rollout_id: str) -> dict[str, Any] | None:
    """The rollout as an ATIF trajectory; None when no call of it can be a step."""
    return trajectory(await load(store, rollout_id))


def trajectory(record: RolloutRecord) -> dict[str, Any] | None:
    steps = _Steps()
    not_steps: list[dict[str, Any]] = []
    context: list[ConversationTurn] = []
    for call in record.calls:
        reason, sent, answer = _turns(call, record.bodies.get(call.id))
        if reason is not None or sent is None or answer is None:
            not_steps.append({"call_id": call.id, "seq": call.seq, "reason": reason})
            continue
        shared = _common_prefix(context, sent)
        for turn in sent[shared:]:
            steps.sent(call, turn)
        routing = record.routing.get((call.id, 0))
        tokens = record.tokens.get(call.id)
        steps.answer(call, answer, tokens, routing, dropped=len(context) - shared)
        context = [*sent, answer]
    if not steps.steps:
        return None
    return _document(record, steps.steps, not_steps)


class _Steps:
    """ATIF steps as they accumulate; tool results go to the step whose calls they answer."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self._awaiting: list[str] = []
        """Tool call ids of the latest agent step that no result answered yet."""
        self._last_agent: dict[str, Any] | None = None
        self._copied = 0

    def sent(self, call: CallView, turn: ConversationTurn) -> None:
        if turn.role == "tool":
            self._result(call, turn.text)
        elif turn.role == "assistant":
            self._copied += 1
            step = self._agent(turn, f"{call.id}.c{self._copied}", call)
            step["is_copied_context"] = True
        else:
            role = turn.role if turn.role in ("system", "user") else "user"
            self._add({"source": role, "message": turn.text, "timestamp": _iso(call)})

    def answer(
        self,
        call: CallView,
        answer: ConversationTurn,
        tokens: CallTokens | None,
        routing: RoutingArray | None,
        *,
        dropped: int,
    ) -> None:
        step = self._agent(answer, call.id, call)
        step["llm_call_count"] = 1
        if call.model:
            step["model_name"] = call.model
        step["metrics"] = _metrics(call, tokens)
        if routing is not None and "prompt_token_ids" in step["metrics"]:
            step["metrics"]["extra"] = {"routed_experts": as_json(routing)}
        rolltap = {
            "call_id": call.id,
            "seq": call.seq,
            "dialect": call.dialect.value,
            "finish_reason": call.finish_reason,
            "weight_version": call.weight_version,
            "capture": call.capture.value,
            "n_choices": call.n_choices,
            "hash": call.hash,
        }
        if dropped:
            rolltap["history_dropped"] = dropped
        step["extra"] = {"rolltap": rolltap}

    def _agent(self, turn: ConversationTurn, id_prefix: str, call: CallView) -> dict[str, Any]:
        step: dict[str, Any] = {"source": "agent", "message": turn.text, "timestamp": _iso(call)}
        if turn.reasoning:
            step["reasoning_content"] = turn.reasoning
        if turn.tool_calls:
            step["tool_calls"] = [
                _tool_call(f"{id_prefix}.{i}", c) for i, c in enumerate(turn.tool_calls)
            ]
        self._add(step)
        self._last_agent = step
        self._awaiting = [c["tool_call_id"] for c in step.get("tool_calls", [])]
        return step

    def _result(self, call: CallView, text: str) -> None:
        holder = self._last_agent
        if holder is None:
            # A tool result before any answer: keep it, on a system step of its own.
            holder = {"source": "system", "message": "", "timestamp": _iso(call)}
            self._add(holder)
        source = self._awaiting.pop(0) if self._awaiting and holder is self._last_agent else None
        results = holder.setdefault("observation", {"results": []})["results"]
        results.append({"source_call_id": source, "content": text})

    def _add(self, step: dict[str, Any]) -> None:
        step["step_id"] = len(self.steps) + 1
        self.steps.append(step)
        if step["source"] != "agent":
            self._last_agent, self._awaiting = None, []


def _turns(
    call: CallView, bodies: CallBodies | None
) -> tuple[str | None, list[ConversationTurn] | None, ConversationTurn | None]:
    """(why the call is not a step, or None; the turns it sent; its answer)."""
    if call.purpose is not None:
        return f"side call ({call.purpose})", None, None
    if call.status is not CallStatus.OK:
        return f"no answer ({call.status.value})", None, None
    if bodies is None:
        return "no bodies recorded", None, None
    sent = request_turns(call.dialect, bodies.request)
    answer = response_turns(call.dialect, bodies.response)
    if sent is None or not answer:
        return "bodies not understood", None, None
    return None, sent, answer[0]


def _common_prefix(a: Sequence[ConversationTurn], b: Sequence[ConversationTurn]) -> int:
    n = 0
    while n < min(len(a), len(b)) and _same(a[n], b[n]):
        n += 1
    return n


def _same(a: ConversationTurn, b: ConversationTurn) -> bool:
    """The same turn as a harness resends it: reasoning may be left out and tool arguments
    re-serialised (drift analysis tells those apart; a trajectory view need not)."""
    if (a.role, a.text.strip()) != (b.role, b.text.strip()):
        return False
    calls = [(c.name, parsed_arguments(c.arguments)) for c in a.tool_calls]
    return calls == [(c.name, parsed_arguments(c.arguments)) for c in b.tool_calls]


def _tool_call(call_id: str, call: ToolCall) -> dict[str, Any]:
    arguments = parsed_arguments(call.arguments)
    if not isinstance(arguments, dict):
        arguments = {"input": arguments}
    return {"tool_call_id": call_id, "function_name": call.name, "arguments": arguments}


def _metrics(call: CallView, tokens: CallTokens | None) -> dict[str, Any]:
    metrics: dict[str, Any] = {
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": call.completion_tokens,
    }
    if tokens is None or call.capture is not Capture.TOKENS:
        return metrics
    choice = next((c for c in tokens.choices if c.index == 0), None)
    metrics["prompt_token_ids"] = tokens.prompt_ids.tolist()
    metrics["prompt_tokens"] = len(tokens.prompt_ids)
    if choice is not None:
        metrics["completion_token_ids"] = choice.token_ids.tolist()
        metrics["completion_tokens"] = len(choice.token_ids)
        if choice.logprobs is not None:
            metrics["logprobs"] = [
                x if math.isfinite(x) else _LOG_ZERO for x in choice.logprobs.tolist()
            ]
    return metrics


def _iso(call: CallView) -> str:
    return call.received_at.isoformat()


def _document(
    record: RolloutRecord, steps: list[dict[str, Any]], not_steps: list[dict[str, Any]]
) -> dict[str, Any]:
    r = record.rollout
    run = r.meta.get("run") or {}
    agent_steps = [s for s in steps if "metrics" in s]
    agent: dict[str, Any] = {
        "name": r.harness or run.get("harness") or "unknown",
        "version": str(run.get("harness_version") or "unknown"),
    }
    if r.model:
        agent["model_name"] = r.model
    flagged = by_call(r.hack_flags)
    for step in steps:
        about = step.get("extra", {}).get("rolltap", {})
        if about.get("call_id") in flagged and "llm_call_count" in step:
            about["hack_flags"] = flagged[about["call_id"]]
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": r.id,
        "trajectory_id": r.id,
        "agent": agent,
        "steps": steps,
        "notes": (
            f"Exported by rolltap {__version__} from rollout {r.id}: one agent step per LLM "
            "call, with the engine's token ids and logprobs where they were captured."
        ),
        "final_metrics": {
            "total_prompt_tokens": sum(s["metrics"]["prompt_tokens"] for s in agent_steps),
            "total_completion_tokens": sum(s["metrics"]["completion_tokens"] for s in agent_steps),
            "total_steps": len(steps),
            "extra": {"llm_calls": len(agent_steps), "recorded_calls": len(record.calls)},
        },
        "extra": {
            "rolltap": {
                "rollout_id": r.id,
                "batch_id": r.batch_id,
                "task_id": r.task_id,
                "sample_index": r.sample_index,
                "attempt": r.attempt,
                "status": r.status.value,
                "reward": r.reward,
                "reward_details": r.reward_details,
                "head_hash": r.head_hash,
                "head_seq": r.head_seq,
                "hack_flags": r.hack_flags,
                "run": run or None,
                "calls_not_steps": not_steps,
            }
        },
    }
