"""Sandboxes a rollout runs in, behind one Protocol."""
