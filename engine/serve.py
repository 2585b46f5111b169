"""Run the engine as a server process: bind, load and warm up the model, report ready, shut down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .adapter import resolve_adapter
from .errors import ModelLoadError
from .model import ModelSource, offline_hub, resolve_model
from .params import LogprobsMode

if TYPE_CHECKING:
    from .batcher import Batcher
    from .core import Engine, OutputLimits
    from .model import LoadedModel

log = logging.getLogger("rolltap.engine")

READY_LINE = "rolltap engine ready"


@dataclass(frozen=True)
class ServeConfig:
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8200
    device: str = "cpu"
    dtype: str = "auto"
    served_model_name: str | None = None
    chat_template: Path | None = None
    reasoning_parser: str = "none"
    logprobs_mode: LogprobsMode = LogprobsMode.PROCESSED
    max_batch: int = 16
    max_model_len: int | None = None
    threads: int | None = None
    prefix_cache_tokens: int = 32768
    """Most tokens the prefix cache holds; 0 turns prefix caching off."""
    default_max_tokens: int | None = None
    """max_tokens for requests that set none; None: what the context leaves (vLLM)."""
    max_tokens_cap: int | None = None
    """Requests asking for more generate at most this many; None: no cap (vLLM)."""
    max_body: int = 64 * 1024 * 1024
    """Largest request body in bytes; larger ones get 413."""
    gguf_cache: bool = True
    adapter: str | None = None
    """A LoRA file merged into the weights at load, `default` for rolltap's own (adapter.py),
    or None / `none` for the plain model."""
    weight_version: str = "default"
    """The label of the weights loaded at start (vLLM's and SGLang's default is "default")."""
    ready_file: Path | None = None
    """Where to write {"url", "port", "model", "pid"} once ready (how launch.py learns port 0)."""
    parent_fd: int | None = None
    """Read end of a pipe from the parent: EOF means the parent died, so this process exits."""


def serve(config: ServeConfig) -> None:
    """Blocks until SIGTERM/SIGINT (or the parent dies); raises ModelLoadError for a bad model."""
    offline_hub()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(_serve(config))


async def _serve(config: ServeConfig) -> None:
    from .endpoint import EngineSlot
    from .server import make_app

    source = resolve_model(config.model, config.served_model_name)
    adapter = resolve_adapter(config.adapter)
    template = _read_template(config.chat_template)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config.parent_fd is not None:
        _watch_parent(config.parent_fd, lambda: loop.call_soon_threadsafe(stop.set))

    slot = EngineSlot(served_name=source.served_name, started=time.time())
    app = make_app(slot, max_body=config.max_body)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = _bound_port(runner, config.port)
    url = f"http://{config.host}:{port}"
    log.info("listening on %s, loading %s", url, source.served_name)
    try:
        loading = _in_daemon_thread(lambda: _build_engine(config, source, template, adapter))
        stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        waiters: set[asyncio.Future[Any]] = {loading, stopped}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            return  # asked to stop while loading; the daemon loader dies with the process
        stopped.cancel()
        slot.engine = loading.result()
        try:
            _report_ready(config, url, port, source.served_name)
            await stop.wait()
        finally:
            await asyncio.to_thread(slot.engine.batcher.stop)
    finally:
        await runner.cleanup()


def _build_engine(
    config: ServeConfig, source: ModelSource, template: str | None, adapter: Path | None
) -> Engine:
    from ..chatformat.template import ChatRenderer
    from .batcher import Batcher, BatcherConfig
    from .core import Engine, OutputLimits
    from .model import load_model

    started = time.monotonic()
    lm = load_model(
        source, config.device, config.dtype, config.max_model_len, config.gguf_cache, adapter
    )
    batcher_config = BatcherConfig(
        max_batch=config.max_batch,
        threads=config.threads,
        prefix_cache_tokens=config.prefix_cache_tokens,
    )
    batcher = Batcher(lm, config.logprobs_mode, batcher_config, config.weight_version)
    batcher.start()
    _warm_up(lm, batcher)
    log.info("model loaded and warmed up in %.1fs", time.monotonic() - started)
    limits = OutputLimits(config.default_max_tokens, config.max_tokens_cap)
    _log_settings(lm, batcher, limits)
    return Engine(
        lm,
        batcher,
        ChatRenderer(lm.tokenizer, template),
        config.reasoning_parser == "think",
        limits,
    )


def _log_settings(lm: LoadedModel, batcher: Batcher, limits: OutputLimits) -> None:
    log.info("max model len %d (trained: %d)", lm.max_model_len, lm.trained_len)
    capacity = batcher.prefix_cache_capacity
    if capacity:
        gib = capacity * batcher.kv_bytes_per_token / 2**30
        log.info("prefix caching on: up to %d tokens (%.2f GiB of keys/values)", capacity, gib)
    else:
        log.info("prefix caching off")
    log.info(
        "max_tokens: default %s, cap %s",
        limits.default_max_tokens or "what the context leaves",
        limits.max_tokens_cap or "none",
    )


def _warm_up(lm: LoadedModel, batcher: Batcher) -> None:
    """Two rows through prefill, join, decode and leave, so no client pays for first use."""
    from .generation import Aborted, Event, Failure, GenerationRequest
    from .params import SamplingParams

    done = threading.Event()
    failures: list[str] = []
    open_rows = [2]

    def sink(event: Event) -> None:
        if isinstance(event, Failure):
            failures.append(event.message)
            done.set()
        elif isinstance(event, Aborted) or event.finish_reason is not None:
            open_rows[0] -= 1
            if open_rows[0] == 0:
                done.set()

    ids = list(lm.tokenizer("Hello, how are you?", add_special_tokens=True)["input_ids"])
    batcher.submit(GenerationRequest(ids, 4, SamplingParams(temperature=0.0), n=2), sink)
    if not done.wait(timeout=600):
        raise ModelLoadError("the warm-up forward pass did not finish")
    if failures:
        raise ModelLoadError(f"the warm-up forward pass failed: {failures[0]}")


def _read_template(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text()
    except OSError as e:
        raise ModelLoadError(f"cannot read --chat-template {path}: {e}") from e


def _in_daemon_thread(work: Callable[[], Engine]) -> asyncio.Future[Engine]:
    """Run `work` in a daemon thread: a stop during loading must not wait for the load to end."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Engine] = loop.create_future()

    def run() -> None:
        try:
            result = work()
        except BaseException as e:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, future, None, e)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=run, name="rolltap-load", daemon=True).start()
    return future


def _settle(
    future: asyncio.Future[Engine], result: Engine | None, error: BaseException | None
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    elif result is not None:
        future.set_result(result)


def _watch_parent(fd: int, on_exit: Callable[[], object]) -> None:
    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 1):
                pass
        log.info("parent process went away; shutting down")
        on_exit()

    threading.Thread(target=watch, name="rolltap-parent-watch", daemon=True).start()


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked


def _report_ready(config: ServeConfig, url: str, port: int, model: str) -> None:
    if config.ready_file is not None:
        info = {"url": url, "port": port, "model": model, "pid": os.getpid()}
        partial = config.ready_file.with_name(config.ready_file.name + ".partial")
        partial.write_text(json.dumps(info))
        partial.replace(config.ready_file)
    print(f"{READY_LINE} {url} model={model}", flush=True)
    sys.stdout.flush()
