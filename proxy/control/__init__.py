"""The proxy's control plane, acting on its context: weight updates, replicas, admin, expiry and
the staleness check (what they drive: hold.py, control_bus.py, staleness.py)."""
