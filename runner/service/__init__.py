"""The rollout service: trainers submit batches over HTTP and receive complete groups of
token-faithful trajectories as they finish (rolltap.client speaks to it).

It runs inside the proxy (`rolltap serve --runner`: `embedded.extension`) or as its own process
pointing at a proxy (`python -m rolltap.runner.service`). Modules: `spec` (what a batch asks
for), `scheduler` (groups, dynamic sampling, early stop), `executor` (where a rollout runs),
`groups` (kept or dropped, and their messages), `events` (the SSE log), `service` (batches and
idempotency), `routes` (HTTP), `clock` (policy versions, for staleness).
"""

from rolltap.proxy.staleness import StalePolicy
from rolltap.runner.service.batch import Batch, BatchStatus
from rolltap.runner.service.clock import GateClock, PolicyClock, RemoteClock, VersionClock
from rolltap.runner.service.embedded import RunnerSettings, extension, service_for
from rolltap.runner.service.executor import (
    ExecutorFactory,
    LocalHost,
    RolloutExecutor,
    local_executors,
)
from rolltap.runner.service.routes import SERVICE, mount
from rolltap.runner.service.service import Service
from rolltap.runner.service.spec import (
    BatchSpec,
    Keep,
    PoolSizes,
    ServiceLimits,
    SpecError,
    parse_spec,
)

__all__ = [
    "SERVICE",
    "Batch",
    "BatchSpec",
    "BatchStatus",
    "ExecutorFactory",
    "GateClock",
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
