"""The training view's figures: a run's batches (one rollout-service session, those with some
labels, or named ones) per policy version.

Per version, over the batches sampled with it: mean reward (rewarded samples) and pass@1 and
pass@k (k = samples per task) of the current attempts; groups kept and dropped by the service
(dynamic sampling: its record of each batch); the staleness of the calls (how many versions,
in the run's order, the weights that sampled a call were behind the batch's policy version,
over the calls an engine answered; "off policy": the share sampled with another version);
the token-in bridge break rate (analysis/bridging.py); and what the trainer posted (POST
/v1/batches/{id}/metrics): the logprob mismatch and seconds per phase, merged as
ui/posted.py says. Without posted seconds, a version shows the service's own sampling
time.

Versions are ordered as numbers when they read as numbers, else in the order batches used them.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from multidict import MultiMapping

from ..analysis.bridging import Bridging
from ..analysis.outcomes import bridging_by_batch
from ..runner.summary import current_attempts, pass_at_k
from ..store import RolloutView, Store
from ..store.models import MetricsSource
from ..store.training import PostedMetrics, call_versions, metrics_of
from .errors import BadQuery
from .posted import MISMATCH_MAX, MISMATCH_MEAN, SECONDS, combine, merge_posts, number, shown

PHASE_ORDER = ("sample", "wait", "train", "update")
"""Phases drawn first, in this order; any other follows by name."""
NO_VERSION = "-"


@dataclass(frozen=True)
class RunSelection:
    session: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    batches: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.session is None and not self.labels and not self.batches

    def query(self) -> str:
        pairs = [("session", self.session)] if self.session else []
        pairs += [("label", f"{k}={v}") for k, v in self.labels]
        pairs += [("batch", b) for b in self.batches]
        return urlencode(pairs)

    def describe(self) -> str:
        parts = [f"session {self.session}"] if self.session else []
        parts += [f"{k}={v}" for k, v in self.labels]
        parts += [f"batch {b}" for b in self.batches]
        return ", ".join(parts)


def parse_selection(query: MultiMapping[str]) -> RunSelection:
    labels = []
    for raw in query.getall("label", []):
        key, sep, value = raw.strip().partition("=")
        if not sep or not key:
            raise BadQuery(f"label {raw!r}: write it as key=value (label=run=exp-1)")
        labels.append((key.strip(), value.strip()))
    session = query.get("session", "").strip() or None
    batches = tuple(b.strip() for b in query.getall("batch", []) if b.strip())
    return RunSelection(session, tuple(labels), batches)


@dataclass(frozen=True)
class BatchFacts:
    batch_id: str
    version: str | None
    labels: dict[str, Any]
    service: dict[str, Any] | None
    """The service's latest record of the batch; None for a batch it did not run."""
    rollouts: list[RolloutView]
    """Current attempts."""

    @property
    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for view in self.rollouts:
            counts[view.status.value] += 1
        return dict(counts)


@dataclass(frozen=True)
class Staleness:
    calls: int
    mean: float | None
    max: int | None
    off_policy: float | None
    """Share of the calls sampled with another version than the batch's policy version."""


@dataclass
class VersionRow:
    version: str
    batches: list[str] = field(default_factory=list)
    samples: int = 0
    rewarded: int = 0
    mean_reward: float | None = None
    k: int | None = None
    pass_at_1: float | None = None
    pass_at_k: float | None = None
    kept: int | None = None
    dropped: dict[str, int] | None = None
    """Dropped groups by reason; None (with kept) when no batch has a service record."""
    staleness: Staleness | None = None
    bridging: Bridging | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    seconds_source: str | None = None
    """trainer (posted) or service (its sampling time only)."""
    posted: dict[str, Any] = field(default_factory=dict)
    """The trainer's figures, merged (see the module's docstring)."""

    @property
    def mismatch_max(self) -> float | None:
        return number(self.posted.get(MISMATCH_MAX))

    @property
    def mismatch_mean(self) -> float | None:
        return number(self.posted.get(MISMATCH_MEAN))

    @property
    def dropped_total(self) -> int | None:
        return None if self.dropped is None else sum(self.dropped.values())

    @property
    def other_posted(self) -> list[tuple[str, str, str]]:
        """(name, the value as posted in JSON, as shown) of the other posted figures."""
        known = {MISMATCH_MAX, MISMATCH_MEAN, SECONDS}
        return [
            (name, json.dumps(value), shown(value))
            for name, value in sorted(self.posted.items())
            if name not in known
        ]


@dataclass(frozen=True)
class Run:
    selection: RunSelection
    batches: list[BatchFacts]
    rows: list[VersionRow]
    sessions: list[str]

    @property
    def versions(self) -> list[str]:
        return [r.version for r in self.rows]

    @property
    def phases(self) -> list[str]:
        names = {p for r in self.rows for p in r.seconds}
        first = [p for p in PHASE_ORDER if p in names]
        return first + sorted(names - set(first))

    @property
    def drop_reasons(self) -> list[str]:
        return sorted({k for r in self.rows for k in (r.dropped or {})})


async def read_run(store: Store, selection: RunSelection, pass_reward: float) -> Run:
    service_rows = await store.db.read(
        metrics_of, None, session=selection.session, source=MetricsSource.SERVICE
    )
    latest = _latest(service_rows)
    if selection.session is not None or selection.labels:
        ids = [b for b, rec in latest.items() if _labelled(rec, selection.labels)]
        if selection.batches:
            ids = [b for b in ids if b in selection.batches]
    else:
        ids = list(selection.batches)
    if not ids:
        return Run(selection, [], [], [])
    records = await store.db.read(metrics_of, ids)
    latest = _latest([r for r in records if r.source is MetricsSource.SERVICE])
    trainer = [r for r in records if r.source is MetricsSource.TRAINER]
    views = await store.rollouts(batch=ids, oldest_first=True)
    by_batch: dict[str, list[RolloutView]] = defaultdict(list)
    for view in views:
        by_batch[view.batch_id or ""].append(view)
    batches = []
    for batch_id in sorted(ids, key=lambda b: _started(by_batch[b], latest.get(b))):
        record = latest.get(batch_id)
        version = record.policy_version if record is not None else None
        rollouts = current_attempts(by_batch[batch_id])
        if version is None:
            version = next((_text(v.meta.get("policy_version")) for v in rollouts), None)
        labels = dict(record.metrics.get("labels") or {}) if record is not None else {}
        service = record.metrics if record is not None else None
        batches.append(BatchFacts(batch_id, version, labels, service, rollouts))
    calls = await store.db.read(call_versions, ids)
    bridges = await store.db.read(bridging_by_batch, ids)
    rows = _rows(batches, trainer, calls, bridges, pass_reward)
    sessions = sorted({r.session for r in latest.values() if r.session})
    return Run(selection, batches, rows, sessions)


def _rows(
    batches: Sequence[BatchFacts],
    trainer: Sequence[PostedMetrics],
    calls: Mapping[str, Mapping[str, int]],
    bridges: Mapping[str, Bridging],
    pass_reward: float,
) -> list[VersionRow]:
    seen = [b.version for b in batches] + [p.policy_version for p in trainer]
    seen += [v for b in batches for v in sorted(calls.get(b.batch_id, {}))]
    order = ordered_versions(seen)
    rank = {v: i for i, v in enumerate(order)}
    rows: dict[str, VersionRow] = {}

    def row(version: str | None) -> VersionRow:
        key = NO_VERSION if version is None else version
        return rows.setdefault(key, VersionRow(key))

    by_version: dict[str | None, list[BatchFacts]] = defaultdict(list)
    for batch in batches:
        by_version[batch.version].append(batch)
    for version, members in by_version.items():
        _fill(row(version), version, members, calls, bridges, rank, pass_reward)
    posts: dict[tuple[str | None, str], list[PostedMetrics]] = defaultdict(list)
    for post in trainer:
        posts[(post.policy_version, post.batch_id)].append(post)
    merged: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for (version, _), batch_posts in posts.items():
        merged[version].append(merge_posts(p.metrics for p in batch_posts))
    for version, per_batch in merged.items():
        target = row(version)
        target.posted = combine(per_batch)
        phases = target.posted.get(SECONDS)
        if isinstance(phases, dict) and phases:
            target.seconds = {k: float(v) for k, v in phases.items()}
            target.seconds_source = MetricsSource.TRAINER.value
    keyed = [*(v for v in order), NO_VERSION]
    return [rows[v] for v in keyed if v in rows]


def _fill(
    row: VersionRow,
    version: str | None,
    members: Sequence[BatchFacts],
    calls: Mapping[str, Mapping[str, int]],
    bridges: Mapping[str, Bridging],
    rank: Mapping[str, int],
    pass_reward: float,
) -> None:
    row.batches = [b.batch_id for b in members]
    current = [v for b in members for v in b.rollouts]
    rewards = [v.reward for v in current if v.reward is not None and not math.isnan(v.reward)]
    row.samples, row.rewarded = len(current), len(rewards)
    row.mean_reward = sum(rewards) / len(rewards) if rewards else None
    tasks: dict[tuple[str, str | None], list[RolloutView]] = defaultdict(list)
    for b in members:
        for v in b.rollouts:
            tasks[(b.batch_id, v.task_id)].append(v)
    spt = [int(b.service["samples_per_task"]) for b in members if b.service]
    k = max(spt) if spt else max((len(vs) for vs in tasks.values()), default=0)
    counts = [(len(vs), sum(_passed(v, pass_reward) for v in vs)) for vs in tasks.values()]
    if k:
        row.k = k
        row.pass_at_1 = _mean([pass_at_k(n, c, 1) for n, c in counts if n >= 1])
        row.pass_at_k = _mean([pass_at_k(n, c, k) for n, c in counts if n >= k])
    serviced = [b.service for b in members if b.service is not None]
    if serviced:
        row.kept = sum(int(s["groups"]["kept"]) for s in serviced)
        dropped: dict[str, int] = defaultdict(int)
        for s in serviced:
            for reason, n in (s["groups"].get("dropped") or {}).items():
                dropped[reason] += int(n)
        row.dropped = dict(dropped)
        sampled = [float((s.get(SECONDS) or {}).get("sample", 0.0)) for s in serviced]
        if any(sampled):
            row.seconds = {"sample": sum(sampled)}
            row.seconds_source = MetricsSource.SERVICE.value
    row.staleness = staleness(version, [calls.get(b.batch_id, {}) for b in members], rank)
    outcomes: dict[str, int] = defaultdict(int)
    for b in members:
        for outcome, n in (bridges[b.batch_id].outcomes if b.batch_id in bridges else {}).items():
            outcomes[outcome] += n
    row.bridging = Bridging(dict(outcomes)) if outcomes else None


def staleness(
    version: str | None, calls: Sequence[Mapping[str, int]], rank: Mapping[str, int]
) -> Staleness | None:
    """How far behind `version` (in `rank`'s order) the weights of the calls were."""
    counted = [(v, n) for batch in calls for v, n in batch.items()]
    total = sum(n for _, n in counted)
    if not total:
        return None
    off = sum(n for v, n in counted if v != version)
    if version is None or version not in rank:
        return Staleness(total, None, None, off / total)
    gaps = [(rank[version] - rank[v], n) for v, n in counted if v in rank]
    return Staleness(
        total,
        sum(g * n for g, n in gaps) / total,
        max(g for g, _ in gaps),
        off / total,
    )


def ordered_versions(seen: Iterable[str | None]) -> list[str]:
    """Distinct versions: numeric ones by value, then the others in the order seen."""
    first: dict[str, int] = {}
    for v in seen:
        if v is not None and v not in first:
            first[v] = len(first)

    def key(v: str) -> tuple[int, float, int]:
        number = _as_float(v)
        return (0, number, 0) if number is not None else (1, 0.0, first[v])

    return sorted(first, key=key)


def _latest(records: Sequence[PostedMetrics]) -> dict[str, PostedMetrics]:
    latest: dict[str, PostedMetrics] = {}
    for record in records:  # oldest first
        latest[record.batch_id] = record
    return latest


def _labelled(record: PostedMetrics, wanted: Sequence[tuple[str, str]]) -> bool:
    labels = record.metrics.get("labels") or {}
    return all(key in labels and label_text(labels[key]) == value for key, value in wanted)


def label_text(value: object) -> str:
    """A label's value as `label=key=value` names it: strings as they are, others as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def _started(rollouts: Sequence[RolloutView], record: PostedMetrics | None) -> str:
    """When a batch started, as sortable text (its first rollout, else its service record)."""
    if rollouts:
        return min(v.created_at for v in rollouts).isoformat()
    return record.posted_at.isoformat() if record is not None else ""


def _passed(view: RolloutView, pass_reward: float) -> bool:
    return view.reward is not None and view.reward >= pass_reward


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _as_float(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _text(value: object) -> str | None:
    return None if value is None else str(value)
