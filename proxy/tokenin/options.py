"""What `--token-in` and its flags choose, for `rolltap serve` and the runner's own proxies."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenInOptions:
    enabled: bool = False
    """Token-in mode for rollouts that do not choose (`token_in` on POST /admin/rollouts): each
    conversation's next prompt is its previous prompt, the sampled ids and a bridge, sent to
    the engine's token-in route (proxy/tokenin)."""
    route: str = "completions"
    """Where token-in calls go: "completions" (vLLM's and rolltap's engine's /v1/completions,
    SGLang's /generate; rolltap parses the text with the parsers below) or "chat" (the engine's
    chat route with the ids attached; the engine's own parsers read the answer)."""
    tool_call_parser: str = "hermes"
    """How tool calls are read from the generated text (vLLM's names)."""
    reasoning_parser: str | None = None
    """How reasoning is read from the generated text; None: none is."""
    tokenizer: str | None = None
    """Bridges rendered in process: a local model or tokenizer directory (or GGUF file) with the
    engine's chat template; None: the engine's /tokenize renders them."""
    chat_template: str | None = None
    """With `tokenizer`: the chat template file the engine was given."""
