"""The rollout service: trainers submit batches over HTTP and receive complete groups of
token-faithful trajectories as they finish (rolltap.client speaks to it).

It runs inside the proxy (`rolltap serve --runner`: `embedded.extension`) or as its own process
pointing at a proxy (`python -m rolltap.runner.service`). Modules: `spec` (what a batch asks
for), `scheduler` (groups, dynamic sampling, early stop), `executor` (where a rollout runs),
`groups` (kept or dropped, and their messages), `events` (the SSE log), `service` (batches and
idempotency), `routes` (HTTP), `clock` (policy versions, for staleness).
"""

from ...proxy.staleness import StalePolicy
from .batch import Batch, BatchStatus
from .clock import HoldClock, PolicyClock, RemoteClock, VersionClock
from .embedded import RunnerSettings, extension, service_for
from .executor import ExecutorFactory, LocalHost, RolloutExecutor, local_executors
from .routes import SERVICE, mount
from .service import Service
from .spec import BatchSpec, Keep, PoolSizes, ServiceLimits, SpecError, parse_spec

__all__ = [
    "SERVICE",
    "Batch",
    "BatchSpec",
    "BatchStatus",
    "ExecutorFactory",
    "HoldClock",
    "Keep",
    "LocalHost",
    "PolicyClock",
    "PoolSizes",
    "RemoteClock",
    "RolloutExecutor",
    "RunnerSettings",
    "Service",
    "ServiceLimits",
    "SpecError",
    "StalePolicy",
    "VersionClock",
    "extension",
    "local_executors",
    "mount",
    "parse_spec",
    "service_for",
]
