"""How proxy replicas sharing one PostgreSQL store tell each other about control orders.

Each replica keeps one PostgreSQL connection that LISTENs on the channel `rolltap_control` and is
named `rolltap-proxy <replica id>` (its application_name). The live replicas are the sessions of
that name in pg_stat_activity: there is no registry to keep, and a replica that dies leaves it
with its connection. An order (pause, a weight update, a backend added) is one NOTIFY; each
other replica applies it (proxy/control/replicated.py) and may reply with NOTIFYs of its own (held,
drained), which the sender waits for, for at most the timeout it gives. NOTIFY is delivered in
commit order, so every replica applies orders in the order they were sent.

A proxy on SQLite is alone by construction (`SoloBus`): publishing tells nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg
import orjson

from ..store.url import DatabaseURL

log = logging.getLogger("rolltap.proxy")

CHANNEL = "rolltap_control"
_NAME_PREFIX = "rolltap-proxy "
_KEEP_REPLIES = 256
"""Orders whose replies are kept: far more than the control calls under way at once."""
_PEERS = (
    "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name LIKE 'rolltap-proxy %' AND pid <> pg_backend_pid()"
)


@dataclass(frozen=True)
class Order:
    op: str
    origin: str
    """The replica that sent it."""
    id: str
    args: dict[str, Any] = field(default_factory=dict)
    reply_to: str | None = None
    """Set on a reply: the id of the order it answers."""

    def encode(self) -> str:
        doc = {"op": self.op, "origin": self.origin, "id": self.id, "args": self.args}
        if self.reply_to is not None:
            doc["reply_to"] = self.reply_to
        return orjson.dumps(doc).decode()

    @classmethod
    def decode(cls, payload: str) -> Order:
        doc = orjson.loads(payload)
        return cls(doc["op"], doc["origin"], doc["id"], doc.get("args") or {}, doc.get("reply_to"))


@dataclass(frozen=True)
class Sent:
    order: Order
    peers: frozenset[str]
    """The replicas that were live when it was sent: the ones whose replies count."""


Handler = Callable[[Order], Awaitable[None]]
Joined = Callable[[], Awaitable[None]]
"""Run once the bus listens, and again after each reconnection (orders sent meanwhile were
missed: the replica takes the others' state again)."""


class ControlBus(Protocol):
    replica_id: str

    async def start(self, handler: Handler, joined: Joined) -> None: ...

    async def stop(self) -> None: ...

    async def peers(self) -> frozenset[str]: ...

    async def publish(self, op: str, args: dict[str, Any] | None = None) -> Sent: ...

    async def reply(self, order: Order, op: str, args: dict[str, Any]) -> None: ...

    async def replies(self, sent: Sent, op: str, timeout: float) -> dict[str, dict[str, Any]]:
        """The `op` replies of `sent.peers` to `sent`, by replica, once all came or `timeout`
        seconds passed (a replica missing from the answer did not reply in time)."""
        ...


def new_replica_id() -> str:
    # application_name keeps 63 bytes: host, pid and a random part fit well within.
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class SoloBus:
    """A proxy with no replicas (a SQLite store has one writer machine)."""

    def __init__(self) -> None:
        self.replica_id = new_replica_id()

    async def start(self, handler: Handler, joined: Joined) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def peers(self) -> frozenset[str]:
        return frozenset()

    async def publish(self, op: str, args: dict[str, Any] | None = None) -> Sent:
        return Sent(Order(op, self.replica_id, uuid.uuid4().hex, args or {}), frozenset())

    async def reply(self, order: Order, op: str, args: dict[str, Any]) -> None:
        return None

    async def replies(self, sent: Sent, op: str, timeout: float) -> dict[str, dict[str, Any]]:
        return {}


class PostgresBus:
    def __init__(self, url: DatabaseURL) -> None:
        self.replica_id = new_replica_id()
        self._dsn = url.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._handler: Handler | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._replies: OrderedDict[str, dict[str, dict[str, dict[str, Any]]]] = OrderedDict()
        """Order id -> reply op -> replica -> args, for this replica's latest orders."""
        self._arrived = asyncio.Condition()
        self._joined: Joined | None = None
        self._stopping = False

    async def start(self, handler: Handler, joined: Joined) -> None:
        self._handler, self._joined = handler, joined
        await self._connection()
        await joined()

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=5)
            self._conn = None

    async def peers(self) -> frozenset[str]:
        async with self._lock:
            conn = await self._connection()
            rows = await conn.fetch(_PEERS)
        return frozenset(str(r["application_name"])[len(_NAME_PREFIX) :] for r in rows)

    async def publish(self, op: str, args: dict[str, Any] | None = None) -> Sent:
        order = Order(op, self.replica_id, uuid.uuid4().hex, args or {})
        self._replies[order.id] = {}
        if len(self._replies) > _KEEP_REPLIES:
            self._replies.popitem(last=False)
        peers = await self.peers()
        await self._notify(order)
        return Sent(order, peers)

    async def reply(self, order: Order, op: str, args: dict[str, Any]) -> None:
        await self._notify(Order(op, self.replica_id, uuid.uuid4().hex, args, order.id))

    async def replies(self, sent: Sent, op: str, timeout: float) -> dict[str, dict[str, Any]]:
        got = self._replies.setdefault(sent.order.id, {}).setdefault(op, {})

        def complete() -> bool:
            return sent.peers <= got.keys()

        async with self._arrived:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait_for(complete), timeout)
        return {peer: got[peer] for peer in sent.peers if peer in got}

    async def _notify(self, order: Order) -> None:
        async with self._lock:
            conn = await self._connection()
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, order.encode())

    async def _connection(self) -> asyncpg.Connection:
        """The listening connection, opened again if it was lost."""
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        conn = await asyncpg.connect(
            self._dsn, server_settings={"application_name": _NAME_PREFIX + self.replica_id}
        )
        await conn.add_listener(CHANNEL, self._received)
        conn.add_termination_listener(self._lost)
        self._conn = conn
        return conn

    def _lost(self, _conn: object) -> None:
        """The database dropped the listening connection (a restart, a failover, a terminated
        backend): a replica that only listens would go deaf, so listen again at once."""
        if not self._stopping:
            self._spawn(self._rejoin())

    async def _rejoin(self, pause: float = 1.0) -> None:
        while not self._stopping:
            try:
                async with self._lock:
                    await self._connection()
                break
            except (OSError, asyncpg.PostgresError) as e:
                log.warning("replica control channel: reconnecting: %s", e)
                await asyncio.sleep(pause)
        log.warning("replica control channel: listening again; taking the others' state")
        if self._joined is not None and not self._stopping:
            await self._joined()

    def _received(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            order = Order.decode(payload)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("ignored a malformed order on %s", CHANNEL)
            return
        if order.origin == self.replica_id:
            return
        if order.reply_to is not None:
            waiting = self._replies.get(order.reply_to)
            if waiting is not None:
                waiting.setdefault(order.op, {})[order.origin] = order.args
                self._spawn(self._wake())
            return
        if self._handler is not None:
            # Tasks start in creation order, and every handler applies its order before its
            # first await: orders take effect in the order they were sent.
            self._spawn(self._handler(order))

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("a control order failed on this replica")

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wake(self) -> None:
        async with self._arrived:
            self._arrived.notify_all()


def bus_for(url: DatabaseURL) -> ControlBus:
    return SoloBus() if url.is_sqlite else PostgresBus(url)
