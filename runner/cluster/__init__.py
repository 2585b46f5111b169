"""Rollouts on a Ray cluster (`rolltap[ray]`): one agent per node, rollouts as Ray work that
needs a `sandbox` resource, the shared store on PostgreSQL.

| file | what it holds |
|---|---|
| `node.py` | `NodeAgent`: a node's store, proxy, sandbox provider and rollouts |
| `dispatch.py` | `RayDispatch`: rollouts placed by the `sandbox` resource; lost nodes retried |
| `batch.py` | `run_batch_on_ray`, behind `rolltap run --ray` |
| `service.py` | `ray_executors`: the rollout service's batches on the cluster |
"""
