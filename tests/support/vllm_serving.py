"""vLLM's real OpenAI HTTP server around a CPU engine client backed by rolltap's built-in model:
the judge of what rolltap's token capture reads from vLLM's own serving layer.

vLLM 0.33's API server is `build_app` + `init_app_state`
(vllm/entrypoints/launchers/{app.py,api_server/app_state.py}) with arguments from vLLM's own
parser (`make_arg_parser`), around an `EngineClient` (vllm/engine/protocol.py); vLLM's server
hands that app to uvicorn. Here the engine client is `CpuEngineClient`: rolltap's built-in model
(rolltap.engine.model: SmolLM2 from its dequantized GGUF cache, float32 on CPU) sampling one
token per forward pass, yielding `RequestOutput`s as vLLM's AsyncLLM does (delta, cumulative or
final only, per `SamplingParams.output_kind`). Everything between the HTTP request and
`generate()` — request parsing, chat-template rendering (OnlineRenderer), sampling-parameter
mapping, `return_token_ids`, logprob and streaming-chunk assembly — is vLLM's code.

The server runs in its own process (`python -m tests.support.vllm_serving`): vLLM picks its
platform once per process, and on this CUDA wheel without a GPU only `VLLM_TARGET_DEVICE=cpu`,
set before vLLM first resolves it, makes that the CPU platform (otherwise `DeviceConfig` fails
with "Failed to infer device type"). The child binds 127.0.0.1 on a free port, prints
`READY <port>`, and appends one JSON line per finished request (prompt ids, sampled ids and
their logprobs) to a record file the test reads back: `vllm_server()` starts it and yields the
URL and those records.

Needs vLLM's wheel with its serving dependencies (.ci/setup-contract: uvicorn, watchfiles,
prometheus-fastapi-instrumentator, model-hosting-container-standards, jmespath) and the built-in
model; `missing()` says why it cannot be built.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import socket
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "smollm2"
MAX_MODEL_LEN = 2048

# What vLLM's app imports beyond its protocol and serving modules (.ci/setup-contract).
_SERVING_MODULES = (
    "fastapi",
    "uvicorn",
    "watchfiles",
    "prometheus_fastapi_instrumentator",
    "model_hosting_container_standards",
    "jmespath",
    "vllm",
    "torch",
    "transformers",
)


def missing() -> str | None:
    """Why vLLM's server cannot be built here; None when it can."""
    for name in _SERVING_MODULES:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError) as e:
            return f"{name} cannot be found: {e} (run .ci/setup-contract)"
        if found is None:
            return (
                f"{name} is not installed, which vLLM's API server imports (run .ci/setup-contract)"
            )
    from rolltap.engine.model import default_gguf_path

    gguf = default_gguf_path()
    if not gguf.exists():
        return f"the built-in engine's model is not here: {gguf}"
    return None


# -- the child process: vLLM's app around the CPU engine client ---------------------------------


def _build_engine_client(record: Path | None) -> Any:
    """The engine-client class (vLLM is imported only in the server's process); each finished
    request is appended to `record` as one JSON line."""
    import torch
    from vllm.config import VllmConfig
    from vllm.engine.protocol import EngineClient
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.renderers import renderer_from_config
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    from rolltap.engine.model import LoadedModel

    class CpuEngineClient(EngineClient):
        """vLLM's `EngineClient` over rolltap's built-in model, one request at a time.

        Samples greedily at temperature 0 (otherwise from the tempered softmax, seeded by
        `seed`); logprobs are the raw model distribution's (vLLM's default `raw_logprobs`).
        Honours max_tokens, EOS and stop_token_ids, ignore_eos, and logprobs=k; n must be 1 and
        stop strings are not applied."""

        def __init__(self, vllm_config: VllmConfig, loaded: LoadedModel) -> None:
            self.vllm_config = vllm_config
            self.model_config = vllm_config.model_config
            self.renderer = renderer_from_config(vllm_config)
            self.input_processor = InputProcessor(vllm_config, self.renderer)
            self.loaded = loaded
            self.tokenizer = loaded.tokenizer
            self._lock = asyncio.Lock()
            self._aborted: set[str] = set()
            self._paused = False

        # generation

        def _step(self, ids: list[int], past: Any) -> tuple[torch.Tensor, Any]:
            with torch.inference_mode():
                out = self.loaded.model(
                    input_ids=torch.tensor([ids], device=self.loaded.device),
                    past_key_values=past,
                    use_cache=True,
                )
            return torch.log_softmax(out.logits[0, -1].float(), dim=-1), out.past_key_values

        def _pick(self, logprobs: torch.Tensor, sp: SamplingParams, gen: torch.Generator) -> int:
            if sp.temperature < 1e-5:
                return int(torch.argmax(logprobs))
            probs = torch.softmax(logprobs / sp.temperature, dim=-1)
            return int(torch.multinomial(probs, 1, generator=gen))

        def _position(self, logprobs: torch.Tensor, token: int, k: int) -> dict[int, Any]:
            from vllm.logprobs import Logprob

            chosen = float(logprobs[token])
            rank = int((logprobs > logprobs[token]).sum()) + 1
            position = {token: Logprob(chosen, rank, self.tokenizer.decode([token]))}
            if k > 0:
                top = torch.topk(logprobs, k)
                for r, (value, tid) in enumerate(zip(top.values, top.indices, strict=True), 1):
                    position.setdefault(
                        int(tid), Logprob(float(value), r, self.tokenizer.decode([int(tid)]))
                    )
            return position

        def _output(
            self,
            request_id: str,
            prompt_ids: list[int],
            ids: list[int],
            text: str,
            logprobs: list[dict[int, Any]] | None,
            finish: str | None,
            stop_reason: int | None,
        ) -> RequestOutput:
            choice = CompletionOutput(
                index=0,
                text=text,
                token_ids=ids,
                cumulative_logprob=None,
                logprobs=logprobs,
                finish_reason=finish,
                stop_reason=stop_reason,
            )
            return RequestOutput(
                request_id=request_id,
                prompt=None,
                prompt_token_ids=prompt_ids,
                prompt_logprobs=None,
                outputs=[choice],
                finished=finish is not None,
                num_cached_tokens=0,
            )

        async def generate(
            self,
            prompt: Any,
            sampling_params: SamplingParams,
            request_id: str,
            **_: Any,
        ) -> AsyncGenerator[RequestOutput, None]:
            sp = sampling_params
            if sp.n != 1:
                raise ValueError("CpuEngineClient samples one choice per request (n=1)")
            prompt_ids = [int(i) for i in prompt["prompt_token_ids"]]
            eos = set() if sp.ignore_eos else set(self.loaded.eos_token_ids)
            stops = set(sp.stop_token_ids or ())
            k = sp.logprobs or 0
            gen = torch.Generator().manual_seed(sp.seed if sp.seed is not None else 0)
            skip = sp.skip_special_tokens
            ids: list[int] = []
            positions: list[dict[int, Any]] = []
            sampled_logprobs: list[float] = []
            text = ""
            sent = 0
            finish: str | None = None
            stop_reason: int | None = None
            max_tokens = sp.max_tokens if sp.max_tokens is not None else MAX_MODEL_LEN
            async with self._lock:
                past: Any = None
                feed = prompt_ids
                while finish is None:
                    if request_id in self._aborted:
                        finish = "abort"
                    else:
                        logprobs, past = await asyncio.to_thread(self._step, feed, past)
                        token = self._pick(logprobs, sp, gen)
                        ids.append(token)
                        sampled_logprobs.append(float(logprobs[token]))
                        positions.append(self._position(logprobs, token, k))
                        feed = [token]
                        if token in stops:
                            finish, stop_reason = "stop", token
                        elif token in eos and len(ids) >= sp.min_tokens:
                            finish = "stop"
                        elif len(ids) >= max_tokens:
                            finish = "length"
                    full = self.tokenizer.decode(ids, skip_special_tokens=skip)
                    if finish is None and full.endswith("\ufffd"):
                        continue  # an incomplete UTF-8 sequence: wait for its next byte
                    if finish is not None:
                        # Recorded before the last output goes out, so before the answer ends.
                        _record(request_id, prompt_ids, ids, sampled_logprobs, finish)
                    if sp.output_kind is RequestOutputKind.DELTA:
                        yield self._output(
                            request_id,
                            prompt_ids,
                            ids[sent:],
                            full[len(text) :],
                            positions[sent:] if sp.logprobs is not None else None,
                            finish,
                            stop_reason,
                        )
                    elif sp.output_kind is RequestOutputKind.CUMULATIVE or finish is not None:
                        yield self._output(
                            request_id,
                            prompt_ids,
                            list(ids),
                            full,
                            list(positions) if sp.logprobs is not None else None,
                            finish,
                            stop_reason,
                        )
                    text, sent = full, len(ids)
            self._aborted.discard(request_id)

        def encode(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("CpuEngineClient serves generation only")

        async def abort(self, request_id: str | Iterable[str]) -> None:
            self._aborted.update([request_id] if isinstance(request_id, str) else request_id)

        async def get_supported_tasks(self) -> tuple[Any, ...]:
            return ("generate",)

        # state vLLM's routes ask about

        @property
        def is_running(self) -> bool:
            return True

        @property
        def is_stopped(self) -> bool:
            return False

        @property
        def errored(self) -> bool:
            return False

        @property
        def dead_error(self) -> BaseException:
            return RuntimeError("CpuEngineClient does not die")

        async def notify_kv_transfer_request_rejected(self, *args: Any, **kwargs: Any) -> None:
            return None

        async def is_tracing_enabled(self) -> bool:
            return False

        async def do_log_stats(self) -> None:
            return None

        async def check_health(self) -> None:
            return None

        async def start_profile(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError

        async def stop_profile(self) -> None:
            raise NotImplementedError

        async def reset_mm_cache(self) -> None:
            return None

        async def reset_encoder_cache(self) -> None:
            return None

        async def reset_prefix_cache(
            self, reset_running_requests: bool = False, reset_connector: bool = False
        ) -> bool:
            return True

        async def sleep(self, level: int = 1, mode: Any = "abort") -> None:
            raise NotImplementedError

        async def release_kv_cache_memory(self) -> None:
            raise NotImplementedError

        async def wake_up(self, tags: list[str] | None = None) -> bool:
            return True

        async def is_sleeping(self) -> bool:
            return False

        async def add_lora(self, lora_request: Any) -> bool:
            raise NotImplementedError("CpuEngineClient has no LoRA support")

        async def pause_generation(self, *, mode: Any = "abort", clear_cache: bool = True) -> None:
            self._paused = True

        async def resume_generation(self) -> None:
            self._paused = False

        async def is_paused(self) -> bool:
            return self._paused

        def shutdown(self, timeout: float | None = None) -> None:
            return None

    def _record(
        request_id: str, prompt_ids: list[int], ids: list[int], logprobs: list[float], finish: str
    ) -> None:
        if record is None:
            return
        line = {
            "request_id": request_id,
            "prompt_token_ids": prompt_ids,
            "token_ids": ids,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        with record.open("a") as f:
            f.write(json.dumps(line) + "\n")

    return CpuEngineClient


def vllm_args(model_dir: str, *extra: str) -> argparse.Namespace:
    """vLLM's own `vllm serve` arguments for the model directory."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    return parser.parse_args(
        [
            "--model",
            model_dir,
            "--served-model-name",
            SERVED_NAME,
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--dtype",
            "float32",  # what the built-in engine computes in on CPU
            "--host",
            "127.0.0.1",
            "--disable-uvicorn-access-log",
            *extra,
        ]
    )


async def _serve(record: Path | None) -> None:
    import uvicorn
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    from rolltap.engine.gguf_cache import lookup
    from rolltap.engine.model import default_gguf_path, load_model, resolve_model

    loaded = load_model(resolve_model(None), device="cpu", max_model_len=MAX_MODEL_LEN)
    model_dir = lookup(default_gguf_path())
    if model_dir is None:
        raise RuntimeError("the built-in engine wrote no dequantized model directory")
    args = vllm_args(str(model_dir))
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    client_cls = _build_engine_client(record)
    engine = client_cls(vllm_config, loaded)
    tasks = await engine.get_supported_tasks()
    app = build_app(args, tasks, engine.model_config)
    await init_app_state(engine, app.state, args, tasks)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving
            return
        await asyncio.sleep(0.05)
    print(f"READY {sock.getsockname()[1]}", flush=True)
    await serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", type=Path, help="append one JSON line per finished request")
    ns = parser.parse_args()
    asyncio.run(_serve(ns.record))


# -- the test side -------------------------------------------------------------------------------


@dataclass
class Served:
    url: str
    record: Path

    def sampled(self) -> list[dict[str, Any]]:
        """What the engine client sampled, one dict per finished request, oldest first."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]


@contextlib.asynccontextmanager
async def vllm_server(record: Path, *, startup_timeout: float = 180.0) -> AsyncIterator[Served]:
    """vLLM's server in a child process on 127.0.0.1; stopped (SIGTERM, then SIGKILL) on exit."""
    env: Mapping[str, str] = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.vllm_serving",
        "--record",
        str(record),
        cwd=REPO_ROOT,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    output = bytearray()  # the child's stdout and stderr, the last 64 KiB of them
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def drain(stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            if line.startswith(b"READY ") and not ready.done():
                ready.set_result(int(line.split()[1]))
            output.extend(line)
            del output[:-65536]

    draining = [asyncio.create_task(drain(s)) for s in (proc.stdout, proc.stderr)]
    try:
        exited = asyncio.create_task(proc.wait())
        await asyncio.wait([ready, exited], timeout=startup_timeout, return_when="FIRST_COMPLETED")
        if not ready.done():
            exited.cancel()
            await asyncio.sleep(0.2)  # the child's last words
            why = f"exited with {proc.returncode}" if exited.done() else "is not up"
            tail = bytes(output[-4000:]).decode(errors="replace")
            raise RuntimeError(f"vLLM's server {why} after {startup_timeout:.0f} s:\n{tail}")
        yield Served(f"http://127.0.0.1:{ready.result()}", record)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for task in draining:
            task.cancel()
        await asyncio.gather(*draining, return_exceptions=True)


if __name__ == "__main__":
    main()
