"""What every page handler reads: the store (opened read-only) and the viewer's shared parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from ..runner.summary import PASS_REWARD
from ..store import Store
from .analysis import Analyses
from .templates import Templates
from .tokens import TokenSource


@dataclass(frozen=True)
class UISettings:
    host: str = "127.0.0.1"
    port: int = 8200
    admin_token: str | None = None
    """Required by every request when set; required to be set beyond loopback."""
    tokenizer: Path | None = None
    """A local tokenizer folder or .gguf file for token text (see rolltap.ui.tokens)."""
    page_size: int = 50
    """Rows per page of the rollout and batch lists."""
    pass_reward: float = PASS_REWARD
    """The reward at which a sample counts as passed (pass@k), as `rolltap run` counts it."""


@dataclass
class UIContext:
    store: Store
    settings: UISettings
    tokenizers: TokenSource
    templates: Templates = field(default_factory=Templates)
    analyses: Analyses = field(default_factory=Analyses)


CONTEXT = web.AppKey("context", UIContext)
