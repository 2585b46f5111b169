"""`rolltap model serve` and `python -m rolltap.engine`: the engine's own command line.

It lives with the engine because the engine starts itself as a child process through it
(launch.py runs `python -m rolltap.engine`): the CLI adds it to `rolltap model`, and the engine
never imports the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .errors import ModelLoadError
from .params import LogprobsMode

F = TypeVar("F", bound=Callable[..., Any])


def adapter_option(default: str) -> Callable[[F], F]:
    """--adapter for commands that start the built-in engine (`default` or `none` by default)."""
    return click.option(
        "--adapter",
        default=default,
        show_default=True,
        metavar="PATH|default|none",
        help="Built-in engine: a LoRA file merged into the model's weights at load. default: "
        "rolltap's own for SmolLM2-135M, taught mini-swe-agent's tool call "
        "(examples/mswea_adapter.py), used only on the default model; none: the plain model.",
    )


@click.command("serve")
@click.argument("model_path", metavar="[MODEL]", required=False)
@click.option("--port", default=8200, show_default=True, help="TCP port; 0 picks a free one.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="auto: float32 on CPU, bfloat16 on CUDA.",
)
@click.option("--served-model-name", default=None, help="Name clients use as `model`.")
@click.option(
    "--chat-template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A jinja chat template file that replaces the model's own.",
)
@click.option(
    "--reasoning-parser", type=click.Choice(["think", "none"]), default="none", show_default=True
)
@click.option(
    "--logprobs-mode",
    type=click.Choice([m.value for m in LogprobsMode]),
    default=LogprobsMode.PROCESSED.value,
    show_default=True,
)
@click.option("--max-batch", default=16, show_default=True, help="Most sequences decoded at once.")
@click.option(
    "--max-model-len",
    type=click.IntRange(min=2),
    default=None,
    help="Context length (default: the model's). Above the model's trained length it runs, "
    "with a startup warning: positions never trained on degrade the output.",
)
@click.option(
    "--prefix-caching/--no-prefix-caching",
    "--enable-prefix-caching/--no-enable-prefix-caching",
    default=True,
    show_default=True,
    help="Reuse the keys/values of earlier sequences for the prompt prefix they share.",
)
@click.option(
    "--prefix-cache-tokens",
    type=click.IntRange(min=1),
    default=32768,
    show_default=True,
    help="Most tokens the prefix cache holds (SmolLM2-135M, float32: 45 KiB a token, 1.5 GB).",
)
@click.option(
    "--default-max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="max_tokens for requests that set none (default: what the context leaves, as vLLM).",
)
@click.option(
    "--max-tokens-cap",
    type=click.IntRange(min=1),
    default=None,
    help="Requests asking for more generate at most this many, ending with finish_reason "
    "length (default: no cap).",
)
@click.option(
    "--threads", type=int, default=None, help="torch threads (default: usable cores minus one)."
)
@click.option("--max-body-mb", default=64.0, show_default=True, help="Largest request body.")
@click.option(
    "--gguf-cache/--no-gguf-cache",
    default=True,
    show_default=True,
    help="Keep a dequantized copy of a GGUF model (in ROLLTAP_ENGINE_CACHE or the user cache "
    "directory) so later starts skip the slow GGUF parse.",
)
@click.option(
    "--weight-version",
    default="default",
    show_default=True,
    help="Label of the weights loaded at start; /update_weights_from_disk sets later ones.",
)
@adapter_option("none")
@click.option("--ready-file", type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--parent-fd", type=int, default=None, hidden=True)
def serve(
    model_path: str | None,
    port: int,
    host: str,
    device: str,
    dtype: str,
    served_model_name: str | None,
    chat_template: Path | None,
    reasoning_parser: str,
    logprobs_mode: str,
    max_batch: int,
    max_model_len: int | None,
    prefix_caching: bool,
    prefix_cache_tokens: int,
    default_max_tokens: int | None,
    max_tokens_cap: int | None,
    threads: int | None,
    max_body_mb: float,
    gguf_cache: bool,
    weight_version: str,
    adapter: str,
    ready_file: Path | None,
    parent_fd: int | None,
) -> None:
    """Serve MODEL (a Hugging Face directory or a .gguf file; default SmolLM2-135M-Instruct)
    over an OpenAI-compatible API that speaks vLLM's dialect (token ids, logprobs)."""
    from .serve import ServeConfig
    from .serve import serve as run_server

    config = ServeConfig(
        model=model_path,
        host=host,
        port=port,
        device=device,
        dtype=dtype,
        served_model_name=served_model_name,
        chat_template=chat_template,
        reasoning_parser=reasoning_parser,
        logprobs_mode=LogprobsMode(logprobs_mode),
        max_batch=max_batch,
        max_model_len=max_model_len,
        prefix_cache_tokens=prefix_cache_tokens if prefix_caching else 0,
        default_max_tokens=default_max_tokens,
        max_tokens_cap=max_tokens_cap,
        threads=threads,
        max_body=int(max_body_mb * 1024 * 1024),
        gguf_cache=gguf_cache,
        weight_version=weight_version,
        adapter=adapter,
        ready_file=ready_file,
        parent_fd=parent_fd,
    )
    try:
        run_server(config)
    except ModelLoadError as e:
        raise click.ClickException(str(e)) from e
