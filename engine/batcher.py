"""Dynamic batching: one scheduler thread prefills new requests and decodes running rows together.

Each loop iteration (1) takes new requests and cancellations from the inbox, (2) prefills waiting
requests up to a token budget (long prompts in chunks, so running streams keep getting tokens),
adding each finished prefill as n rows of the batch cache, and (3) runs one batched forward over
every running row and samples each row's next token with its own parameters and RNG. Tokens are
handed to each request's sink as soon as they are sampled, so every stream of a batch streams.

With prefix caching on, a prefill starts after the longest prefix of its prompt that the prefix
cache holds (copied in, never recomputed); every finished prefill adds its prompt, and every row
that leaves the batch (finished or cancelled) adds the ids whose keys/values it computed: the
prompt and every sampled token but the last, which was never fed back.

A weight update is a command like the others, so it never races a forward pass: from the moment
it arrives no new prefill starts (requests that arrive or wait are held), rows still decoding
either finish (the default) or end at once with finish_reason "abort"; once no row runs, the new
weights are copied in, the prefix cache (keys/values of the old weights) is emptied, held
requests restart their prefill from scratch, and the weights' label changes. Every token event
carries the label of the weights that sampled it.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from transformers.cache_utils import Cache

from .detok import TextStream
from .generation import Aborted, Failure, GenerationRequest, Sink, TokenEvent
from .kvcache import BatchCache, columns, join, keep, new_cache
from .model import LoadedModel
from .params import LogprobsMode
from .prefixcache import PrefixCache
from .sampling import RowSampler, Sample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatcherConfig:
    max_batch: int = 16
    """Most rows (sequences, n counts each) decoded together."""
    prefill_chunk: int = 256
    """Prompt tokens prefilled per loop iteration, between two decode steps."""
    threads: int | None = None
    """torch intra-op threads; None: one per usable core but one, which is left to the event
    loop (on a 2-core box a second OpenMP thread mostly waits on a descheduled sibling)."""
    prefix_cache_tokens: int = 32768
    """Most tokens the prefix cache holds (0: prefix caching off). SmolLM2-135M in float32 takes
    30 layers x 2 (K, V) x 3 kv heads x 64 dims x 4 bytes = 46,080 bytes a token: 1.5 GB."""


@dataclass
class BatcherStats:
    requests_submitted: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_aborted: int = 0
    """Requests ended with finish_reason "abort" (weight updates, abort-all)."""
    weight_updates: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    batched_decode_steps: int = 0
    """Decode steps that ran more than one row."""
    max_batch_seen: int = 0
    decode_steps_by_batch: dict[int, int] = field(default_factory=dict)
    """How many decode steps ran with each number of rows."""
    running: int = 0
    waiting: int = 0
    prefix_cache_lookups: int = 0
    """Prefills that looked for their prompt in the prefix cache."""
    prefix_cache_hits: int = 0
    """Lookups that found at least one token."""
    prefix_cache_hit_tokens: int = 0
    """Prompt tokens copied from the prefix cache instead of computed (`prompt_tokens` counts the
    computed ones)."""
    prefix_cache_tokens: int = 0
    """Tokens the prefix cache holds now."""
    prefix_cache_evicted_tokens: int = 0


@dataclass
class _Pending:
    ticket: int
    request: GenerationRequest
    sink: Sink
    offset: int = 0
    """Prompt tokens prefilled so far."""
    cache: Cache | None = None
    logits: torch.Tensor | None = None


@dataclass
class _Row:
    ticket: int
    index: int
    request: GenerationRequest
    sink: Sink
    sampler: RowSampler
    text: TextStream
    sampled: list[int] = field(default_factory=list)
    finished: bool = False

    @property
    def computed_ids(self) -> list[int]:
        """The ids whose keys/values the row's cache holds: the last sample was never fed."""
        return self.request.prompt_ids + self.sampled[:-1]


@dataclass
class _Ticket:
    sink: Sink
    open_rows: int


@dataclass(frozen=True)
class _Cancel:
    ticket: int


@dataclass(frozen=True)
class UpdateOutcome:
    weight_version: str
    """The label in force after the update (unchanged when it failed)."""
    paused: int
    """Requests held while the update waited or ran; they run on the new weights."""
    aborted: int
    """Requests ended with finish_reason "abort" to let the update in."""
    error: str | None = None


@dataclass(frozen=True)
class _Update:
    apply: Callable[[], None]
    """Copies the new weights into the model; runs on the scheduler thread, between steps."""
    weight_version: str | None
    abort: bool
    flush_cache: bool
    done: Callable[[UpdateOutcome], None]


@dataclass(frozen=True)
class _AbortAll:
    pass


_STOP = object()


class Batcher:
    """Owns the model's forward passes; thread-safe `submit`/`cancel` from any thread."""

    def __init__(
        self,
        lm: LoadedModel,
        mode: LogprobsMode,
        config: BatcherConfig,
        weight_version: str = "default",
    ) -> None:
        self._lm = lm
        self._mode = mode
        self._config = config
        self._inbox: queue.Queue[object] = queue.Queue()
        self._tickets = itertools.count(1)
        self._stats = BatcherStats()
        self._stats_lock = threading.Lock()
        self._waiting: deque[_Pending] = deque()
        self._rows: list[_Row] = []
        self._batch: BatchCache | None = None
        self._open: dict[int, _Ticket] = {}
        self._update: _Update | None = None
        self._aborted_by_update = 0
        self._version = weight_version
        self._thread = threading.Thread(target=self._loop, name="rolltap-batcher", daemon=True)
        cfg = lm.model.config
        self._layers = int(cfg.num_hidden_layers)
        self._kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self._head_dim = int(
            getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        )
        self._vocab = int(lm.model.get_output_embeddings().weight.shape[0])
        capacity = config.prefix_cache_tokens
        self._prefix = PrefixCache(capacity) if capacity > 0 else None

    @property
    def max_batch(self) -> int:
        return self._config.max_batch

    @property
    def prefix_cache_capacity(self) -> int:
        """Most tokens the prefix cache holds; 0 when prefix caching is off."""
        return self._prefix.capacity if self._prefix else 0

    @property
    def kv_bytes_per_token(self) -> int:
        size = torch.empty(0, dtype=self._lm.model.dtype).element_size()
        return self._layers * 2 * self._kv_heads * self._head_dim * size

    @property
    def weight_version(self) -> str:
        """The label of the weights in use (vLLM's and SGLang's `weight_version`)."""
        return self._version

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join()

    def submit(self, request: GenerationRequest, sink: Sink) -> int:
        """Queue a request; its events go to `sink` from the scheduler thread. Returns a ticket."""
        ticket = next(self._tickets)
        self._inbox.put(_Pending(ticket, request, sink))
        return ticket

    def cancel(self, ticket: int) -> None:
        """Stop a request's rows (the client went away); no more events are sent for it."""
        self._inbox.put(_Cancel(ticket))

    def update_weights(
        self,
        apply: Callable[[], None],
        done: Callable[[UpdateOutcome], None],
        *,
        weight_version: str | None,
        abort: bool = False,
        flush_cache: bool = True,
    ) -> None:
        """Swap weights between two steps (see the module docstring); `done` is called from the
        scheduler thread. abort: end running requests with finish_reason "abort" instead of
        letting them finish first."""
        self._inbox.put(_Update(apply, weight_version, abort, flush_cache, done))

    def abort_all(self) -> None:
        """End every running and waiting request now, with finish_reason "abort"."""
        self._inbox.put(_AbortAll())

    def stats(self) -> BatcherStats:
        with self._stats_lock:
            snapshot = replace(
                self._stats, decode_steps_by_batch=dict(self._stats.decode_steps_by_batch)
            )
        # Read without the lock: the scheduler replaces these containers, never leaves them torn.
        snapshot.running = len(self._rows)
        snapshot.waiting = len(self._waiting)
        if self._prefix is not None:
            snapshot.prefix_cache_tokens = self._prefix.tokens
            snapshot.prefix_cache_evicted_tokens = self._prefix.evicted_tokens
        return snapshot

    # -- scheduler thread ------------------------------------------------------------------

    def _loop(self) -> None:
        torch.set_num_threads(self._config.threads or max(1, len(os.sched_getaffinity(0)) - 1))
        with torch.inference_mode():
            while self._take_commands(block=not (self._rows or self._waiting or self._update)):
                try:
                    if self._update is not None and not self._rows:
                        self._apply_update()
                    if self._update is None:
                        self._prefill()
                    if self._rows:
                        self._decode()
                except Exception as e:
                    # The thread boundary: whatever went wrong, the waiting clients must hear of
                    # it, and the loop must keep serving the requests that come next.
                    log.exception("forward pass failed; failing the running requests")
                    self._fail_all(f"engine error: {e}")
        self._fail_all("the engine is shutting down")
        if self._update is not None:
            update, self._update = self._update, None
            outcome = UpdateOutcome(self._version, 0, 0, "the engine is shutting down")
            update.done(outcome)

    def _take_commands(self, block: bool) -> bool:
        """Apply queued submissions and cancellations; False once asked to stop."""
        while True:
            try:
                command = self._inbox.get(block=block, timeout=None)
            except queue.Empty:
                return True
            block = False
            if command is _STOP:
                return False
            if isinstance(command, _Pending):
                self._waiting.append(command)
                self._open[command.ticket] = _Ticket(command.sink, command.request.n)
                self._count(requests_submitted=1)
            elif isinstance(command, _Cancel):
                self._cancel(command.ticket)
            elif isinstance(command, _AbortAll):
                self._abort(include_waiting=True)
            elif isinstance(command, _Update):
                self._begin_update(command)

    def _begin_update(self, update: _Update) -> None:
        if self._update is not None:
            # One at a time: the earlier one has not been applied, and never will be now.
            replaced = self._update
            replaced.done(UpdateOutcome(self._version, 0, 0, "replaced by a later update"))
        self._update = update
        self._aborted_by_update = self._abort(include_waiting=False) if update.abort else 0

    def _apply_update(self) -> None:
        """No row runs: copy the weights in, drop keys/values the old weights computed."""
        update, self._update = self._update, None
        assert update is not None
        paused = len(self._waiting)
        try:
            update.apply()
        except Exception as e:
            log.exception("weight update failed")
            update.done(UpdateOutcome(self._version, paused, self._aborted_by_update, str(e)))
            return
        if update.weight_version is not None:
            self._version = update.weight_version
        if update.flush_cache and self._prefix is not None:
            self._prefix.clear()
        for pending in self._waiting:
            # A prefill begun under the old weights starts over under the new ones.
            pending.offset, pending.cache, pending.logits = 0, None, None
        self._count(weight_updates=1)
        update.done(UpdateOutcome(self._version, paused, self._aborted_by_update))

    def _abort(self, *, include_waiting: bool) -> int:
        """End running rows (and with include_waiting, requests not started) with "abort";
        returns how many requests were touched."""
        touched: set[int] = set()
        for row in self._rows:
            if not row.finished:
                row.finished = True
                row.sink(Aborted(row.index, row.text.finish(), self._version))
                touched.add(row.ticket)
                self._close_row(row.ticket)
        if include_waiting:
            for pending in self._waiting:
                for index in range(pending.request.n):
                    pending.sink(Aborted(index, "", self._version))
                touched.add(pending.ticket)
                self._open.pop(pending.ticket, None)
            self._waiting.clear()
        self._drop_finished()
        self._count(requests_aborted=len(touched))
        return len(touched)

    def _cancel(self, ticket: int) -> None:
        state = self._open.pop(ticket, None)
        if state is None:
            return
        self._count(requests_cancelled=1)
        for pending in self._waiting:
            if pending.ticket == ticket and pending.cache is not None:
                prompt = pending.request.prompt_ids[: pending.offset]
                self._remember(prompt, pending.cache, 0, 0, pending.request.cache_salt)
        self._waiting = deque(p for p in self._waiting if p.ticket != ticket)
        for row in self._rows:
            if row.ticket == ticket:
                row.finished = True
        self._drop_finished()

    def _prefill(self) -> None:
        budget = self._config.prefill_chunk
        while self._waiting and budget > 0:
            pending = self._waiting[0]
            if self._rows and len(self._rows) + pending.request.n > self._config.max_batch:
                return
            budget -= self._prefill_chunk(pending, budget)
            if pending.offset == len(pending.request.prompt_ids):
                self._waiting.popleft()
                self._start_rows(pending)

    def _prefill_chunk(self, pending: _Pending, budget: int) -> int:
        prompt = pending.request.prompt_ids
        if pending.cache is None:
            self._open_prefill(pending)
        chunk = prompt[pending.offset : pending.offset + budget]
        device = self._lm.device
        positions = torch.arange(pending.offset, pending.offset + len(chunk), device=device)
        out = self._lm.model(
            input_ids=torch.tensor([chunk], device=device),
            position_ids=positions.view(1, -1),
            past_key_values=pending.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        pending.offset += len(chunk)
        pending.logits = out.logits[0, -1].float()
        self._count(prompt_tokens=len(chunk))
        return len(chunk)

    def _open_prefill(self, pending: _Pending) -> None:
        """Give the request its one-row cache, holding whatever prefix the prefix cache has."""
        request = pending.request
        prompt = request.prompt_ids
        segments: list[torch.Tensor] = []
        if self._prefix is not None:
            # The last prompt token is always computed: its logits give the first sample.
            hit = self._prefix.lookup(prompt, len(prompt) - 1, request.cache_salt)
            segments, pending.offset = hit.segments, hit.length
            self._count(
                prefix_cache_lookups=1,
                prefix_cache_hits=int(hit.length > 0),
                prefix_cache_hit_tokens=hit.length,
            )
        shape = (1, self._kv_heads, len(prompt) + 1, self._head_dim)
        dtype, device = self._lm.model.dtype, self._lm.device
        pending.cache = new_cache(self._layers, shape, dtype, device, segments)

    def _remember(
        self, ids: list[int], cache: Cache, row: int, first: int, salt: str | None
    ) -> None:
        """Offer ids whose keys/values sit in `cache` row `row` from column `first` on."""
        if self._prefix is not None:
            self._prefix.insert(
                ids, lambda start, end: columns(cache, row, first + start, first + end), salt
            )

    def _start_rows(self, pending: _Pending) -> None:
        request = pending.request
        assert pending.logits is not None
        assert pending.cache is not None
        self._remember(request.prompt_ids, pending.cache, 0, 0, request.cache_salt)
        seed = request.params.seed
        started: list[_Row] = []
        for index in range(request.n):
            row = _Row(
                ticket=pending.ticket,
                index=index,
                request=request,
                sink=pending.sink,
                sampler=RowSampler(
                    request.params,
                    self._mode,
                    self._lm.device,
                    self._vocab,
                    request.prompt_ids,
                    None if seed is None else seed + index,
                ),
                text=TextStream(
                    self._lm.tokenizer,
                    request.stop,
                    request.include_stop_str_in_output,
                    request.skip_special_tokens,
                ),
            )
            self._accept(row, row.sampler.sample(pending.logits))
            if not row.finished:
                started.append(row)
        if started:
            self._batch = join(self._batch, pending.cache, len(started))
            self._rows.extend(started)

    def _decode(self) -> None:
        assert self._batch is not None
        tokens = torch.tensor([row.sampled[-1] for row in self._rows], device=self._lm.device)
        out = self._lm.model(**self._batch.step_inputs(tokens))
        logits = out.logits[:, -1].float()
        for i, row in enumerate(self._rows):
            self._accept(row, row.sampler.sample(logits[i]))
        rows = len(self._rows)
        with self._stats_lock:
            self._stats.decode_steps += 1
            self._stats.batched_decode_steps += rows > 1
            self._stats.max_batch_seen = max(self._stats.max_batch_seen, rows)
            by_batch = self._stats.decode_steps_by_batch
            by_batch[rows] = by_batch.get(rows, 0) + 1
        self._drop_finished()

    def _accept(self, row: _Row, sample: Sample) -> None:
        """Record a sampled token on its row, decide whether the row is done, emit the event."""
        request = row.request
        token = sample.token_id
        row.sampled.append(token)
        text = row.text.push(token)
        finish: str | None = None
        stop_reason: int | str | None = None
        if not request.ignore_eos and token in self._lm.eos_token_ids:
            finish = "stop"
        elif token in request.stop_token_ids:
            finish, stop_reason = "stop", token
        elif row.text.stopped is not None:
            finish, stop_reason = "stop", row.text.stopped
        elif (
            len(row.sampled) >= request.max_tokens
            or len(request.prompt_ids) + len(row.sampled) >= self._lm.max_model_len
        ):
            finish = "length"
        if finish is not None:
            text += row.text.finish()
            row.finished = True
        self._count(generated_tokens=1)
        row.sink(
            TokenEvent(
                row.index,
                token,
                sample.logprob,
                sample.top,
                text,
                finish,
                stop_reason,
                self._version,
            )
        )
        if finish is not None:
            self._close_row(row.ticket)

    def _close_row(self, ticket: int) -> None:
        state = self._open.get(ticket)
        if state is None:
            return
        state.open_rows -= 1
        if state.open_rows == 0:
            del self._open[ticket]
            self._count(requests_finished=1)

    def _drop_finished(self) -> None:
        kept = [i for i, row in enumerate(self._rows) if not row.finished]
        if len(kept) == len(self._rows):
            return
        if self._prefix is not None and self._batch is not None:
            for i, row in enumerate(self._rows):
                if row.finished:
                    ids = row.computed_ids
                    first = self._batch.first_column(i)
                    # By construction; a mismatch would poison the cache, so fail loudly.
                    assert self._batch.columns - first == len(ids)
                    self._remember(ids, self._batch.cache, i, first, row.request.cache_salt)
        self._rows = [self._rows[i] for i in kept]
        self._batch = keep(self._batch, kept) if self._batch is not None else None

    def _fail_all(self, message: str) -> None:
        for state in self._open.values():
            state.sink(Failure(message))
        self._open.clear()
        self._waiting.clear()
        self._rows = []
        self._batch = None

    def _count(self, **increments: int) -> None:
        with self._stats_lock:
            for name, value in increments.items():
                setattr(self._stats, name, getattr(self._stats, name) + value)
