"""What `rolltap serve --runner` turns its flags into: the proxy extension serving /v1/batches."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ...proxy.app import Extension
from ...proxy.context import ProxySettings
from ...proxy.upstream.backends import parse_backend
from ...proxy.upstream.routed import refusal
from ..egress import EgressSettings
from ..sandboxes.identity import sandbox_user
from ..sandboxes.kinds import KINDS
from .embedded import RunnerSettings, extension
from .spec import PoolSizes, ServiceLimits


def runner_extension(
    proxy: ProxySettings,
    sandboxes: str,
    concurrency: int,
    tasks_root: Path | None,
    say: Callable[[str], None],
    *,
    egress: EgressSettings | None = None,
    ray_address: str | None = None,
) -> Extension:
    """Raises ValueError for a sandbox kind rolltap does not have. Gives the proxy a unix
    socket (the sandboxes' only way out) when it has none."""
    kinds = tuple(k.strip() for k in sandboxes.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        raise ValueError(f"--runner-sandboxes: use some of {', '.join(KINDS)}")
    if proxy.unix_socket is None:
        # The socket itself admits only this user and the sandboxes' group (proxy/server.py);
        # its directory lets that group through.
        directory = Path(tempfile.mkdtemp(prefix="rolltap-runner-"))
        group = sandbox_user().gid
        os.chown(directory, -1, group)
        directory.chmod(0o750)
        proxy.unix_socket = str(directory / "proxy.sock")
        proxy.unix_socket_group = group
    if not proxy.admin_token:
        say(
            "warning: --runner without --admin-token: anyone who can reach the proxy can run "
            "batches (their tasks run code in sandboxes)"
        )
    limits = ServiceLimits(
        sandboxes=kinds,
        default_sandbox=kinds[0],
        tasks_root=tasks_root,
        max_concurrency=concurrency,
        # No backend given: the built-in engine (a dense model) will serve the batches.
        routed_experts_refusal=refusal(
            (parse_backend(spec)[1] for spec in proxy.backends), builtin=not proxy.backends
        ),
    )
    pools = PoolSizes(concurrency, concurrency, concurrency)
    return extension(
        RunnerSettings(
            limits=limits,
            pools=pools,
            egress=egress or EgressSettings(),
            ray_address=ray_address,
        )
    )
