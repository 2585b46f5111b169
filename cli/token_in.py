"""`--token-in` and its parser flags, shared by `rolltap serve` and `rolltap run`: the command
gets them as one `token_in: TokenInOptions`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..chatformat.parse import REASONING_PARSER_NAMES, TOOL_PARSER_NAMES
from ..proxy.tokenin.options import TokenInOptions

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = (
    click.option(
        "--token-in",
        is_flag=True,
        help="Token-in mode for every rollout that does not choose (`token_in` on POST "
        "/admin/rollouts): each conversation's next prompt is its previous prompt, the sampled "
        "ids and a bridge, so the engine never re-renders the history.",
    ),
    click.option(
        "--token-in-route",
        type=click.Choice(["completions", "chat"]),
        default="completions",
        show_default=True,
        help="Token-in: completions sends the ids to the engine's completions route (SGLang: "
        "/generate) and parses the text with the two parsers below; chat sends them with the "
        "chat request (vLLM >= 0.33 kv_transfer_params, SGLang input_ids, rolltap's engine) so "
        "the engine's own parsers read the answer.",
    ),
    click.option(
        "--tool-call-parser",
        type=click.Choice(TOOL_PARSER_NAMES),
        default="hermes",
        show_default=True,
        help="Token-in: how tool calls are read from generated text (vLLM's names).",
    ),
    click.option(
        "--reasoning-parser",
        type=click.Choice(REASONING_PARSER_NAMES),
        help="Token-in: how reasoning is read from generated text (default: none is).",
    ),
    click.option(
        "--tokenizer",
        type=click.Path(exists=True, path_type=Path),
        help="Token-in: the engine's model or tokenizer directory (or GGUF file), to render "
        "bridges in process; default: the engine's /tokenize renders them.",
    ),
    click.option(
        "--chat-template",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Token-in with --tokenizer: the chat template file the engine was started with.",
    ),
)
NAMES = (
    "token_in",
    "token_in_route",
    "tool_call_parser",
    "reasoning_parser",
    "tokenizer",
    "chat_template",
)
"""The click parameter names of the flags above."""


def token_in_options(command: F) -> F:
    """Add the token-in flags to `command`, which receives them as `token_in`."""

    @functools.wraps(command)
    def gathered(*args: Any, **kwargs: Any) -> Any:
        enabled, route, tool_parser, reasoning, tokenizer, template = (kwargs.pop(n) for n in NAMES)
        kwargs["token_in"] = TokenInOptions(
            enabled=enabled,
            route=route,
            tool_call_parser=tool_parser,
            reasoning_parser=reasoning,
            tokenizer=None if tokenizer is None else str(tokenizer),
            chat_template=None if template is None else str(template),
        )
        return command(*args, **kwargs)

    wrapped: Any = gathered
    for option in reversed(_OPTIONS):
        wrapped = option(wrapped)
    return wrapped  # type: ignore[no-any-return]
