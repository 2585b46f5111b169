"""Rollouts on a Ray cluster (`rolltap[ray]`): one agent per node, rollouts as Ray work that
needs a `sandbox` resource, the shared store on PostgreSQL.

| file | what it holds |
|---|---|
| `node.py` | `NodeAgent`: a node's store, proxy, sandbox provider and rollouts |
| `dispatch.py` | `RayDispatch`: rollouts placed by the `sandbox` resource; lost nodes retried |
| `service.py` | `cluster_executors`: a batch on the cluster (`rolltap run --ray`, the service) |
| `batch.py` | `run_batch_on_ray`: `run_batch` on the cluster, for scripts and tests |
"""
