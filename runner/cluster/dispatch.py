"""Rollouts as Ray work: each one holds a unit of a node's `sandbox` resource while it runs there.

A node offers sandboxes by being started with that resource (`ray start --resources
'{"sandbox": 16}'`); its value is the node's cap on concurrent sandboxes, and Ray never places
more rollouts on a node than it has units free. Each node of the batch gets one agent
(node.py) pinned to it; a rollout is a small Ray task needing one `sandbox` unit (and no CPU:
the sandbox's processes are the work) that hands the rollout to the agent of the node it
landed on and waits for it.

A lost node (its raylet or machine gone: Ray raises NodeDiedError, or the agent died) fails the
attempts running there. Each is retried as a new attempt (runner/plan.py:next_attempt: a new
row and key, the old one kept, marked and pointing to it) wherever Ray places it, up to
`retries` times, unless the lost attempt had already finished and recorded its result. Ray's own
task retries are off: a retry with the same rollout key would mix two runs in one attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ...analysis.reading import analyze_rollout
from ...store import RolloutView, Store
from ...store.events import AttemptLost
from ...store.lifecycle import status_of
from ..harnesses import Ending
from ..plan import INFRA, Planned, finished, next_attempt
from ..rollout import RolloutResult
from .node import NodeAgent, NodeSetup

SANDBOX = "sandbox"
"""The custom resource a node offers sandboxes by; one unit per concurrent rollout."""


class NoSandboxNodes(Exception):
    """The cluster has no live node offering the `sandbox` resource."""


def sandbox_nodes() -> dict[str, int]:
    """Live nodes that offer sandboxes: node id -> its cap."""
    return {
        str(n["NodeID"]): int(n["Resources"][SANDBOX])
        for n in ray.nodes()
        if n.get("Alive") and n.get("Resources", {}).get(SANDBOX, 0) >= 1
    }


def _hold_slot(agent_prefix: str, planned: Planned) -> RolloutResult:
    """Runs on the node Ray chose for the rollout, holding one `sandbox` unit meanwhile."""
    node = ray.get_runtime_context().get_node_id()
    agent = ray.get_actor(agent_prefix + node)
    result: RolloutResult = ray.get(agent.run.remote(planned))
    return result


class RayDispatch:
    """Runs a batch's rollouts on the cluster: `open`, then `run` each (concurrently), `close`.
    It is a RolloutExecutor (runner/service/executor.py)."""

    def __init__(self, setup: NodeSetup, store: Store, *, retries: int) -> None:
        self._setup = setup
        self._store = store
        self._retries = retries
        self._prefix = f"rolltap-{uuid.uuid4().hex[:8]}-"
        self._agents: list[ray.actor.ActorHandle] = []
        self._slot = ray.remote(_hold_slot).options(
            num_cpus=0, resources={SANDBOX: 1}, max_retries=0
        )
        self.nodes: dict[str, int] = {}

    async def open(self) -> str:
        """Start an agent on every node that offers sandboxes; the served model's name."""
        self.nodes = sandbox_nodes()
        if not self.nodes:
            raise NoSandboxNodes(
                f"no live Ray node offers the {SANDBOX!r} resource: start nodes with "
                f"ray start --resources='{{\"{SANDBOX}\": N}}' (N: sandboxes at once there)"
            )
        agent_class = ray.remote(NodeAgent)
        for node, cap in self.nodes.items():
            self._agents.append(
                agent_class.options(
                    name=self._prefix + node,
                    num_cpus=0,
                    max_restarts=0,
                    # A thread per rollout at once on the node, and one for open/close.
                    max_concurrency=cap + 1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(self._setup, cap, node)
            )
        models = await asyncio.gather(*(agent.open.remote() for agent in self._agents))
        return str(models[0])

    async def run(self, planned: Planned) -> RolloutResult:
        current = planned
        for tries in range(self._retries + 1):
            try:
                result: RolloutResult = await self._slot.remote(self._prefix, current)
                return result
            except RayError as e:
                why = _describe(e)
                view = await self._store.rollout(current.rollout_id)
                if finished(view):
                    return _recorded(view, current)
                if tries == self._retries:
                    return await _lost(self._store, current, why)
                current = await next_attempt(self._store, current, why)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Stop every agent (their proxies, stores and leftover sandboxes); a dead one is gone."""
        closing = [agent.close.remote() for agent in self._agents]
        await asyncio.gather(*closing, return_exceptions=True)
        for agent in self._agents:
            with contextlib.suppress(RayError):
                ray.kill(agent)
        self._agents.clear()


def _describe(error: RayError) -> str:
    """One line: what failed on the node (the exception our code raised there), or that Ray
    lost the node or its worker."""
    if isinstance(error, RayTaskError):
        cause = error.cause
        while isinstance(cause, RayTaskError):
            cause = cause.cause
        return f"on the node: {type(cause).__name__}: {str(cause).splitlines()[-1][:300]}"
    return f"ray: {type(error).__name__} (the node or its worker was lost)"


def _recorded(view: RolloutView, planned: Planned) -> RolloutResult:
    """The result a lost node had recorded before the driver heard of it."""
    details = view.reward_details or {}
    ending = details.get("ending")
    return RolloutResult(
        view.id,
        planned.task.id,
        planned.sample_index,
        view.attempt,
        view.status,
        view.reward,
        None if ending is None else Ending(ending),
        view.error,
        Path(str(view.meta.get("logs_dir", ""))),
        dict(view.meta.get("seconds") or {}),
        verifier_tail=view.meta.get("verifier_tail"),
        harness_tail=view.meta.get("harness_tail"),
        harness_detail=details.get("harness_detail"),
    )


async def _lost(store: Store, planned: Planned, why: str) -> RolloutResult:
    """Out of retries: the attempt failed for the machine's reasons, as a local one would."""
    error = f"infrastructure: {why}"
    lost = AttemptLost(error, {INFRA: True})
    view = await store.report(planned.rollout_id, lost)
    if view.n_calls:
        await analyze_rollout(store, view.id)
    return RolloutResult(
        view.id,
        planned.task.id,
        planned.sample_index,
        view.attempt,
        status_of(lost),
        None,
        None,
        error,
        Path(str(view.meta.get("logs_dir", ""))),
        {},
    )
