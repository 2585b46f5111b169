"""`python -m rolltap.runner.service`: the rollout service beside a proxy (see standalone.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import platformdirs

from ...store import Store, StoreError
from ...store.spill import spill_root
from ..sandboxes.kinds import KINDS
from .spec import ServiceLimits
from .standalone import StandaloneSettings, serve


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rolltap.runner.service",
        description="The rollout service (/v1/batches) beside a running `rolltap serve`.",
    )
    parser.add_argument("--proxy", required=True, help="the proxy's URL")
    parser.add_argument("--proxy-socket", required=True, type=Path, help="its unix socket")
    parser.add_argument("--model", required=True, help="the model name the proxy serves")
    parser.add_argument("--db", default=os.environ.get("ROLLTAP_DB"), help="the proxy's store")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--admin-token", default=os.environ.get("ROLLTAP_ADMIN_TOKEN"))
    parser.add_argument("--sandboxes", default="bwrap,docker,apptainer")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tasks-root", type=Path)
    args = parser.parse_args()
    kinds = tuple(k for k in args.sandboxes.split(",") if k)
    if not kinds or any(k not in KINDS for k in kinds):
        parser.error(f"--sandboxes: use some of {', '.join(KINDS)}")
    if not args.proxy_socket.exists():
        parser.error(f"--proxy-socket: no socket at {args.proxy_socket}")
    settings = StandaloneSettings(
        proxy=args.proxy,
        proxy_socket=args.proxy_socket,
        model=args.model,
        logs_root=platformdirs.user_data_path("rolltap") / "runs",
        admin_token=args.admin_token,
        limits=ServiceLimits(
            sandboxes=kinds,
            default_sandbox=kinds[0],
            tasks_root=args.tasks_root,
            max_concurrency=args.concurrency,
        ),
        concurrency=args.concurrency,
    )
    try:
        asyncio.run(_run(args.db, settings, args.host, args.port))
    except StoreError as e:
        sys.exit(f"error: {e}")


async def _run(db: str | None, settings: StandaloneSettings, host: str, port: int) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    store = await Store.connect(db, spill=spill_root())
    try:
        runner = await serve(store, settings, host, port)
        print(f"rolltap rollout service on http://{host}:{port}/v1/batches", flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
    finally:
        await store.close()


if __name__ == "__main__":
    main()
