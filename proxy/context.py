"""What every handler shares: settings, the store, backends, routing, the hold, metrics and the
recorder; it holds them, and records nothing itself (recorder.py does)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from ..store import Store
from .control_bus import ControlBus
from .hold import WeightHold
from .metrics import ProxyMetrics
from .recall import Recall
from .recorder import Recorder
from .rollouts import Rollouts
from .tokenin.config import TokenIn
from .tokenin.options import TokenInOptions
from .upstream.backends import BackendPool
from .upstream.model_names import ModelNames
from .upstream.routing import StickyRouter

log = logging.getLogger("rolltap.proxy")


@dataclass
class ProxySettings:
    backends: list[str] = field(default_factory=list)
    """Backend specs: URL (vLLM dialect) or KIND=URL; empty starts the built-in engine."""
    host: str = "127.0.0.1"
    port: int = 8100
    unix_socket: str | None = None
    """Also listen on this unix socket (sandboxes reach the proxy through it)."""
    unix_socket_group: int | None = None
    """The group that may connect to the unix socket besides the proxy's own user: the
    sandboxes' (mode 0660). None: the proxy's user only (0600). Never anyone else: a key is
    a bearer token, and the socket is how sandboxes spend it."""
    open_mode: bool = False
    """Create a rollout for an unknown key on first use (local experiments only)."""
    store_spill: str | None = None
    """The folder where records of sampled calls go when the store stays away past its outage
    limit, written to it once it is back (store/spill.py); None: the user cache's."""
    admin_token: str | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    health_interval: float = 5.0
    connect_timeout: float = 10.0
    read_timeout: float = 3600.0
    """Longest silence from an engine within one answer before the call fails."""
    weight_version: str | None = None
    secret: str | None = field(default=None, repr=False)
    """Signs the references handed to clients (thinking signatures, Responses encrypted_content);
    None keeps a generated one beside the database (proxy/secret.py)."""
    rollout_expiry_seconds: float = 3600.0
    """A rollout outside any batch, unfinished, with no call for this long ends `expired`
    (proxy/control/expiry.py); 0 never."""
    idle_rollout_seconds: float = 600.0
    """A rollout that made no call for this long leaves the proxy's memory (it is read from the
    store again on its next call; finished rollouts leave at once)."""
    workers: int = 1
    """Processes serving this port together (`serve --workers`, proxy/workers.py): each binds it
    with SO_REUSEPORT."""
    model_aliases: dict[str, str] = field(default_factory=dict)
    """Client model name -> served model name (`*`: any name not served); model_names.py."""
    max_tokens_cap: int | None = None
    """The most tokens one call may generate: a larger or missing max_tokens is lowered to it in
    the request the engine gets, and the call is noted. Responses/Messages clients see an answer
    cut by the cap as ended normally (proxy/dialects/translated.py). None: no cap."""
    token_in: TokenInOptions = field(default_factory=TokenInOptions)
    """Token-in mode and its parsers (proxy/tokenin)."""
    cache_salt: bool = True
    """Salt each vLLM-dialect call's prefix cache with its weight version
    (proxy/upstream/sampling.py);
    off, a commit resets those engines' prefix caches instead (proxy/control/weights.py)."""
    capture_routed_experts: bool = False
    """Ask the engine for each token's routed experts (MoE routing replay;
    proxy/upstream/routed.py) on
    every call whose rollout does not choose (`routed_experts` in its metadata)."""
    builtin_engine: bool = False
    """The backend is the built-in engine this process started (a dense model)."""


@dataclass
class ProxyContext:
    settings: ProxySettings
    store: Store
    rollouts: Rollouts
    pool: BackendPool
    router: StickyRouter
    hold: WeightHold
    metrics: ProxyMetrics
    recall: Recall
    """Earlier answers of each rollout, for restoring a harness's history (recall.py)."""
    bus: ControlBus
    """Tells the other replicas on the same PostgreSQL store (proxy/control/replicated.py)."""
    recorder: Recorder
    """Makes each call durable and counts it against its rollout (recorder.py)."""
    tokenin: TokenIn | None = None
    """Token-in mode's parsers, bridges and default (proxy/tokenin); set by make_context."""
    session: aiohttp.ClientSession | None = None
    names: ModelNames = field(default_factory=ModelNames)
    """Which served model answers the model a call asks for (model_names.py)."""
    models_cache: dict[str, tuple[float, bytes]] = field(default_factory=dict)
    """Backend URL -> (fetched at, /v1/models body)."""

    def release(self, rollout_id: str) -> None:
        """Drop what this proxy keeps in memory about a rollout that finished (or went idle):
        its state, sticky route, recalled answers and the writer's recent calls."""
        self.rollouts.forget_rollout(rollout_id)
        self.router.forget(rollout_id)
        self.recall.forget(rollout_id)
        self.store.forget(rollout_id)

    def client(self) -> aiohttp.ClientSession:
        assert self.session is not None, "the proxy's HTTP client starts with the app"
        return self.session


CONTEXT = web.AppKey("rolltap_context", ProxyContext)
