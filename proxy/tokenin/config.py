"""A proxy's token-in mode: its default, its parsers, and where bridges are rendered."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp

from ..upstream.engines import EngineKind
from .bridge import Bridges, RemoteTemplate

_TOKENIZE_PATHS = {EngineKind.VLLM: "/tokenize", EngineKind.SGLANG: "/v1/tokenize"}


@dataclass
class TokenIn:
    default: bool
    """Token-in for rollouts that do not choose."""
    reasoning_parser: str | None
    tool_call_parser: str
    route: str = "completions"
    """TokenInOptions.route."""
    local: Bridges | None = None
    """Bridges rendered in process (`--tokenizer`); None: by each engine's /tokenize."""
    _remote: dict[tuple[str, str | None], Bridges] = field(default_factory=dict)

    def enabled(self, chosen: bool | None) -> bool:
        return self.default if chosen is None else chosen

    def bridges(
        self, session: aiohttp.ClientSession, url: str, kind: EngineKind, model: str | None
    ) -> Bridges:
        """Where the bridges of calls to the backend at `url` serving `model` are rendered."""
        if self.local is not None:
            return self.local
        key = (url, model)
        found = self._remote.get(key)
        if found is None:
            template = RemoteTemplate(session, url, model, _TOKENIZE_PATHS[kind])
            found = self._remote[key] = Bridges(template)
        return found
