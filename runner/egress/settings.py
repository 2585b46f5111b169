"""What a run's egress allows: the mode, host patterns from the CLI, a config file and each task,
and what a sandbox's environment needs to use the gate."""

from __future__ import annotations

import enum
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..sandboxes.base import EGRESS_PORT
from ..tasks import Task
from .errors import BadEgressSetting
from .rules import DEFAULT_INTERCEPT_HOSTS, valid_pattern

BUNDLE_NAME = "egress-ca.pem"
"""The combined CA bundle, written beside the proxy socket (mounted read-only inside)."""

CA_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL: Python's ssl, curl, git, Codex (after CODEX_CA_CERTIFICATE)
    "REQUESTS_CA_BUNDLE",  # requests and pip
    "NODE_EXTRA_CA_CERTS",  # Node and Bun (Claude Code, OpenCode, Qwen Code), added to theirs
    "CODEX_CA_CERTIFICATE",  # Codex
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
)


class EgressMode(enum.StrEnum):
    NONE = "none"
    """No route out but the LLM proxy (the default)."""
    ALLOWLIST = "allowlist"
    """HTTP(S) to allow-listed hosts through the gate; everything else refused and recorded."""
    INTERCEPT = "intercept"
    """allowlist, and LLM API hosts routed into the rollout's proxy endpoint under its key."""


@dataclass(frozen=True)
class EgressSettings:
    mode: EgressMode = EgressMode.NONE
    allow: tuple[str, ...] = ()
    """Host patterns every task that allows the internet may reach (`*.pythonhosted.org`)."""
    intercept_hosts: tuple[str, ...] = DEFAULT_INTERCEPT_HOSTS
    resolve: Mapping[str, str] = field(default_factory=dict)
    """host -> "ADDRESS:PORT" the gate connects to instead of resolving it (a local mirror)."""
    upstream_ca: Path | None = None
    """A CA file the gate trusts for upstream servers instead of the system's (a mirror's)."""

    @property
    def enabled(self) -> bool:
        return self.mode is not EgressMode.NONE

    def allow_for(self, task: Task) -> tuple[str, ...]:
        """A task that forbids the internet reaches nothing (intercepted LLM hosts aside)."""
        env = task.environment
        return (*self.allow, *env.allowed_hosts) if env.allow_internet else ()


def load_settings(
    mode: str,
    allow: Sequence[str] = (),
    config: Path | None = None,
) -> EgressSettings:
    """From `--egress`, `--allow-host` and `--egress-config` (TOML: allow, intercept_hosts,
    upstream_ca, [resolve]); raises BadEgressSetting naming what is wrong."""
    try:
        egress_mode = EgressMode(mode)
    except ValueError:
        raise BadEgressSetting(f"--egress {mode}: choose none, allowlist or intercept") from None
    table: dict[str, Any] = {}
    if config is not None:
        try:
            table = tomllib.loads(config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise BadEgressSetting(f"egress config {config}: {e}") from e
        unknown = set(table) - {"allow", "intercept_hosts", "resolve", "upstream_ca"}
        if unknown:
            raise BadEgressSetting(f"egress config {config}: unknown keys {sorted(unknown)}")
    patterns = (*allow, *_strings(table, "allow"))
    intercept = _strings(table, "intercept_hosts") or DEFAULT_INTERCEPT_HOSTS
    for p in (*patterns, *intercept):
        if not valid_pattern(p):
            raise BadEgressSetting(
                f"host pattern {p!r}: give a host name like pypi.org or *.example.org"
            )
    resolve = table.get("resolve", {})
    if not isinstance(resolve, dict) or not all(
        isinstance(v, str) and v.rpartition(":")[2].isdigit() for v in resolve.values()
    ):
        raise BadEgressSetting('egress config: [resolve] maps host names to "ADDRESS:PORT"')
    upstream_ca = table.get("upstream_ca")
    if upstream_ca is not None and not Path(str(upstream_ca)).is_file():
        raise BadEgressSetting(f"egress config: upstream_ca {upstream_ca} is not a file")
    return EgressSettings(
        mode=egress_mode,
        allow=tuple(patterns),
        intercept_hosts=tuple(intercept),
        resolve=dict(resolve),
        upstream_ca=Path(str(upstream_ca)) if upstream_ca is not None else None,
    )


def sandbox_env(bundle_inside: str, port: int = EGRESS_PORT) -> dict[str, str]:
    """Proxy and CA variables for every command of a sandbox with egress. Loopback is exempt:
    the LLM proxy's own base URL stays direct."""
    url = f"http://127.0.0.1:{port}"
    env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    env |= {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    return env | dict.fromkeys(CA_VARIABLES, bundle_inside)


def _strings(table: dict[str, Any], key: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadEgressSetting(f"egress config: {key} must be a list of host patterns")
    return tuple(value)
