"""vLLM's own control routers around a stub engine client: the judge of every control request
rolltap sends a vLLM backend.

`vllm_plane(fake)` is a FastAPI app that mounts vLLM 0.33's RL router
(vllm/entrypoints/rl/online/api_router.py: pause, resume, weight updates, versions, checksums)
and its dev cache router (vllm/entrypoints/serve/dev/cache: /reset_prefix_cache), with
`app.state.engine_client` a `StubEngine`: vLLM's route code parses the query and body as its
server does (FastAPI with vLLM's own signatures and models) and calls the engine client as
vLLM's would be called; the stub records each call and acts on the fake engine
(tests/support/fake_vllm.py), whose streams freeze, abort and change version accordingly.
A FakeVLLM with `vllm_routes=vllm_plane(fake)` answers its control routes through this app,
so the proxy talks real HTTP to vLLM's routers.

Needs vLLM's wheel (.ci/setup-contract); `missing()` says why it cannot be built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from tests.support.fake_vllm import FakeVLLM


def missing() -> str | None:
    """Why vLLM's routers cannot be mounted here; None when they can."""
    try:
        importlib.import_module("fastapi")
        importlib.import_module("vllm.entrypoints.rl.online.api_router")
        importlib.import_module("vllm.entrypoints.serve.dev.cache.api_router")
    except ImportError as e:
        return f"vLLM's RL routers do not import: {e} (run .ci/setup-contract)"
    return None


@dataclass
class StubEngine:
    """The slice of vLLM's `EngineClient` (vllm/engine/protocol.py) its control routers call."""

    fake: FakeVLLM
    calls: list[tuple[str, Any]] = field(default_factory=list)
    """(method, argument) of every engine-client call vLLM's routes made, in order."""
    updating: bool = False

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append(("pause_generation", mode))
        if mode == "keep" and self.fake.refuse_keep:
            raise ValueError("this engine cannot keep requests frozen")
        await self.fake.pause_engine(mode)

    async def resume_generation(self) -> None:
        self.calls.append(("resume_generation", None))
        self.fake.resume_engine()

    async def is_paused(self) -> bool:
        self.calls.append(("is_paused", None))
        return self.fake.paused is not None

    async def start_weight_update(self) -> None:
        self.calls.append(("start_weight_update", None))
        self.updating = True

    async def update_weights(self, request: Any) -> None:
        # WeightTransferUpdateRequest(update_info=...): the trainer's payload, passed through.
        self.calls.append(("update_weights", request.update_info))
        if not self.updating:
            raise RuntimeError("update_weights outside start/finish_weight_update")

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append(("finish_weight_update", weight_version))
        self.updating = False
        if weight_version is not None:
            self.fake.set_version(weight_version)

    async def update_weight_version(self, new_version: str) -> None:
        self.calls.append(("update_weight_version", new_version))
        self.fake.set_version(new_version)

    async def get_weight_version(self) -> str:
        self.calls.append(("get_weight_version", None))
        return self.fake.version_read()

    async def compute_weight_checksums(self) -> list[dict[str, str]]:
        self.calls.append(("compute_weight_checksums", None))
        return [self.fake.checksums()]

    async def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_external: bool = False
    ) -> bool:
        self.calls.append(("reset_prefix_cache", reset_running_requests))
        self.fake.cache_resets.append("/reset_prefix_cache")
        return not self.fake.refuse_cache_reset

    async def init_weight_transfer_engine(self, request: Any) -> None:
        self.calls.append(("init_weight_transfer_engine", request.init_info))


def vllm_plane(fake: FakeVLLM) -> tuple[Any, StubEngine]:
    """The FastAPI app of vLLM's control routers over a stub of `fake`, and the stub."""
    from fastapi import FastAPI
    from vllm.entrypoints.rl.online.api_router import router as rl_router
    from vllm.entrypoints.serve.dev.cache.api_router import router as cache_router

    app = FastAPI()
    app.include_router(rl_router)
    app.include_router(cache_router)
    stub = StubEngine(fake)
    app.state.engine_client = stub
    return app, stub
