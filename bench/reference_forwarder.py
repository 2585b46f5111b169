"""A minimal aiohttp forwarder for chat completions: the floor under rolltap's added latency.

    python bench/reference_forwarder.py --engine URL --port PORT [--capture]

Plain, it relays each request and answer as bytes. With `--capture` it does the least any
capturing proxy in front of vLLM must do: ask for token ids and logprobs, parse the answer (each
event of a stream), pull the ids and logprobs out into arrays, and strip them before the client
sees the answer. It has no
store, no routing, no rollouts and no validation; proxy_bench.py runs it beside rolltap so the
cost of capture itself (a ~10x larger engine answer parsed in Python) shows apart from rolltap's.
Not part of rolltap.
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

import aiohttp
import numpy as np
import orjson
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
CAPTURE_FIELDS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}


def make_app(engine: str, capture: bool) -> web.Application:
    async def plain(request: web.Request) -> web.Response:
        async with request.app[SESSION].post(
            f"{engine}/v1/chat/completions",
            data=await request.read(),
            headers={"Content-Type": "application/json"},
        ) as upstream:
            answer = await upstream.read()
        return web.Response(body=answer, status=upstream.status, content_type="application/json")

    async def capturing(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if body.get("stream"):
            return await capturing_stream(request, body)
        async with request.app[SESSION].post(
            f"{engine}/v1/chat/completions",
            data=orjson.dumps({**body, **CAPTURE_FIELDS}),
            headers={"Content-Type": "application/json"},
        ) as upstream:
            doc: dict[str, Any] = orjson.loads(await upstream.read())
        prompt = np.asarray(doc.pop("prompt_token_ids"), dtype=np.int32)
        for choice in doc["choices"]:
            ids = np.asarray(choice.pop("token_ids"), dtype=np.int32)
            logprobs = np.fromiter((e["logprob"] for e in choice["logprobs"]["content"]), float)
            if len(ids) != len(logprobs) or not len(prompt):
                raise web.HTTPBadGateway(text="the engine's answer lacks ids or logprobs")
            choice["logprobs"] = None
        return web.Response(body=orjson.dumps(doc), content_type="application/json")

    async def capturing_stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        """The same per event: each chunk parsed, its ids and logprobs pulled out and stripped,
        the chunk written on at once; the arrays made when the stream ends."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        prompt: list[int] = []
        ids: list[int] = []
        logprobs: list[float] = []
        async with request.app[SESSION].post(
            f"{engine}/v1/chat/completions",
            data=orjson.dumps({**body, **CAPTURE_FIELDS}),
            headers={"Content-Type": "application/json"},
        ) as upstream:
            async for line in upstream.content:
                if not line.startswith(b"data: {"):
                    if line.strip():
                        await response.write(line + b"\n")
                    continue
                chunk: dict[str, Any] = orjson.loads(line[6:])
                prompt.extend(chunk.pop("prompt_token_ids", None) or ())
                for choice in chunk.get("choices", ()):
                    ids.extend(choice.pop("token_ids", None) or ())
                    entries = (choice.get("logprobs") or {}).get("content") or ()
                    logprobs.extend(e["logprob"] for e in entries)
                    choice["logprobs"] = None
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        prompt_ids = np.asarray(prompt, dtype=np.int32)
        token_ids = np.asarray(ids, dtype=np.int32)
        if len(token_ids) != len(np.asarray(logprobs, dtype=np.float32)) or not len(prompt_ids):
            await response.write(b'data: {"error": "the answer lacks ids or logprobs"}\n\n')
        await response.write_eof()
        return response

    async def start(app: web.Application) -> None:
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def stop(app: web.Application) -> None:
        await app[SESSION].close()

    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/v1/chat/completions", capturing if capture else plain)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--capture", action="store_true")
    args = parser.parse_args()
    app = make_app(args.engine.rstrip("/"), args.capture)
    # The same startup-heap treatment rolltap's server gets, so the comparison is like for like.
    gc.collect()
    gc.freeze()
    web.run_app(
        app,
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
