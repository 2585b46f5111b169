"""ATIF-v1.8 (Harbor's Agent Trajectory Interchange Format), checked field by field.

Written from Harbor 0.25.0's own models (`harbor/models/trajectories/*.py`: Trajectory, Agent,
Step, ToolCall, Observation, ObservationResult, Metrics, FinalMetrics, all `extra="forbid"`) and
their validators, so a trajectory that passes here passes Harbor's TrajectoryValidator.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

VERSIONS = {f"ATIF-v1.{i}" for i in range(9)}
TRAJECTORY = {
    "schema_version",
    "session_id",
    "trajectory_id",
    "agent",
    "steps",
    "notes",
    "final_metrics",
    "continued_trajectory_ref",
    "extra",
    "subagent_trajectories",
}
AGENT = {"name", "version", "model_name", "tool_definitions", "extra"}
STEP = {
    "step_id",
    "timestamp",
    "source",
    "model_name",
    "reasoning_effort",
    "message",
    "reasoning_content",
    "tool_calls",
    "observation",
    "metrics",
    "is_copied_context",
    "llm_call_count",
    "extra",
}
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
TOOL_CALL = {"tool_call_id", "function_name", "arguments", "extra"}
RESULT = {"source_call_id", "content", "subagent_trajectory_ref"}
METRICS = {
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost_usd",
    "prompt_token_ids",
    "completion_token_ids",
    "logprobs",
    "extra",
}
FINAL = {
    "total_prompt_tokens",
    "total_completion_tokens",
    "total_cached_tokens",
    "total_cost_usd",
    "total_steps",
    "extra",
}


def check(doc: dict[str, Any]) -> None:
    """Raise AssertionError naming the first field that breaks ATIF-v1.8."""
    json.dumps(doc, allow_nan=False)  # strict JSON: no NaN or infinities anywhere
    _keys(doc, TRAJECTORY, "trajectory")
    assert doc["schema_version"] in VERSIONS, doc["schema_version"]
    for name in ("session_id", "trajectory_id", "notes", "continued_trajectory_ref"):
        assert doc.get(name) is None or isinstance(doc[name], str), name
    agent = doc["agent"]
    _keys(agent, AGENT, "agent")
    assert isinstance(agent["name"], str), "agent.name is required"
    assert isinstance(agent["version"], str), "agent.version is required"
    steps = doc["steps"]
    assert isinstance(steps, list), "steps"
    assert steps, "steps: at least one (min_length=1)"
    for i, step in enumerate(steps):
        _step(step, i)
    final = doc.get("final_metrics")
    if final is not None:
        _keys(final, FINAL, "final_metrics")
        for name in ("total_prompt_tokens", "total_completion_tokens", "total_cached_tokens"):
            assert final.get(name) is None or _is_int(final[name]), name
        assert final.get("total_steps") is None or final["total_steps"] >= 0
    assert doc.get("extra") is None or isinstance(doc["extra"], dict), "extra"


def _step(step: dict[str, Any], i: int) -> None:
    where = f"steps[{i}]"
    _keys(step, STEP, where)
    assert step["step_id"] == i + 1, f"{where}.step_id: sequential from 1"
    assert step["source"] in ("system", "user", "agent"), f"{where}.source"
    assert isinstance(step["message"], str | list), f"{where}.message is required"
    if step.get("timestamp") is not None:
        datetime.fromisoformat(step["timestamp"].replace("Z", "+00:00"))
    if step["source"] != "agent":
        for name in AGENT_ONLY:
            assert step.get(name) is None, f"{where}.{name}: only on agent steps"
    count = step.get("llm_call_count")
    if count is not None:
        assert _is_int(count), f"{where}.llm_call_count"
        assert count >= 0, f"{where}.llm_call_count"
        if count == 0 and step["source"] == "agent":
            assert step.get("metrics") is None, f"{where}: no metrics without an LLM call"
            assert step.get("reasoning_content") is None, f"{where}: no reasoning without a call"
    assert step.get("reasoning_content") is None or isinstance(step["reasoning_content"], str)
    assert step.get("is_copied_context") is None or isinstance(step["is_copied_context"], bool)
    ids = set()
    for j, call in enumerate(step.get("tool_calls") or []):
        _keys(call, TOOL_CALL, f"{where}.tool_calls[{j}]")
        assert isinstance(call["tool_call_id"], str), f"{where}.tool_calls[{j}].tool_call_id"
        assert isinstance(call["function_name"], str), f"{where}.tool_calls[{j}].function_name"
        assert isinstance(call["arguments"], dict), f"{where}.tool_calls[{j}].arguments: a dict"
        ids.add(call["tool_call_id"])
    observation = step.get("observation")
    if observation is not None:
        assert set(observation) == {"results"}, f"{where}.observation"
        for j, result in enumerate(observation["results"]):
            _keys(result, RESULT, f"{where}.observation.results[{j}]")
            source = result.get("source_call_id")
            assert source is None or source in ids, f"{where}: {source} is not a tool call here"
            content = result.get("content")
            assert content is None or isinstance(content, str | list)
    metrics = step.get("metrics")
    if metrics is not None:
        _keys(metrics, METRICS, f"{where}.metrics")
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            assert metrics.get(name) is None or _is_int(metrics[name]), f"{where}.metrics.{name}"
        for name in ("prompt_token_ids", "completion_token_ids"):
            values = metrics.get(name)
            assert values is None or all(_is_int(v) for v in values), f"{where}.metrics.{name}"
        logprobs = metrics.get("logprobs")
        assert logprobs is None or all(isinstance(v, float) for v in logprobs)


def _keys(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    assert isinstance(obj, dict), f"{where}: an object"
    extra = set(obj) - allowed
    assert not extra, f"{where}: fields ATIF forbids: {sorted(extra)}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
