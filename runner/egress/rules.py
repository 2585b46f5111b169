"""Who may reach what: host patterns and the per-request decision (stdlib only).

The egress gate (gate.py) imports this module in its own interpreter, next to mitmproxy, so it
uses nothing outside the standard library and nothing of rolltap.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

ALLOWED = "allowed"
DENIED = "denied"
INTERCEPTED = "intercepted"

DEFAULT_INTERCEPT_HOSTS = ("api.openai.com", "api.anthropic.com")
"""LLM API hosts whose calls intercept mode routes into the rollout's proxy endpoint."""

PREAMBLE = b"ROLLTAP-EGRESS "
"""The forwarder opens each egress connection with `PREAMBLE + token + b"\\n"`: the gate
learns which rollout's sandbox it serves without the client's cooperation."""


@dataclass(frozen=True)
class Decision:
    verdict: str
    """ALLOWED, DENIED or INTERCEPTED."""
    reason: str


def normalize_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


def valid_pattern(pattern: str) -> bool:
    """A host name, optionally with `*` wildcards (`*.pythonhosted.org`); no scheme, port or
    path, which would silently match nothing."""
    p = normalize_host(pattern)
    return bool(p) and all(c.isalnum() or c in "-.*_[]" for c in p)


def host_matches(host: str, patterns: tuple[str, ...]) -> bool:
    """`*.example.org` matches its subdomains and also example.org itself."""
    h = normalize_host(host)
    for pattern in patterns:
        p = normalize_host(pattern)
        if fnmatch.fnmatchcase(h, p) or (p.startswith("*.") and h == p[2:]):
            return True
    return False


def decide(
    host: str, *, allow: tuple[str, ...], intercept: tuple[str, ...], intercepting: bool
) -> Decision:
    """Intercepted first (a harness's LLM host is captured even when also allowed), then
    allowed, else denied with a reason the agent can act on."""
    if intercepting and host_matches(host, intercept):
        return Decision(INTERCEPTED, "LLM API host: routed to the rollout's proxy endpoint")
    if host_matches(host, allow):
        return Decision(ALLOWED, "on the allow-list")
    if not allow:
        return Decision(DENIED, f"{host} is not reachable: this rollout's allow-list is empty")
    return Decision(DENIED, f"{host} is not on this rollout's allow-list")
