"""Controlled egress: HTTP(S) out of sandboxes through a per-run mitmproxy gate, allow-listed,
LLM API hosts intercepted into the rollout's proxy endpoint, every request recorded."""

from .errors import BadEgressSetting, EgressError, EgressUnavailable
from .install import install_egress
from .launch import EgressGate, egress_gate
from .settings import EgressMode, EgressSettings, load_settings, sandbox_env

__all__ = [
    "BadEgressSetting",
    "EgressError",
    "EgressGate",
    "EgressMode",
    "EgressSettings",
    "EgressUnavailable",
    "egress_gate",
    "install_egress",
    "load_settings",
    "sandbox_env",
]
