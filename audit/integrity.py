"""Checks a rollout's record against its hash chain (chain.py) and says what does not hold.

    from rolltap.audit.integrity import verify_rollout
    result = await verify_rollout(store, rollout_id)    # blocking: reader.run(verify_rollout(
    result.ok, result.issues, result.refused            #   reader.store, rollout_id))

Every call's digest is recomputed from what the store holds now: the row, its full prompt
rebuilt from the stored deltas, its choices and its decompressed bodies. Then each link is
checked against the call before it, and the rollout's sealed head against the chain. An issue
names the call:

- `altered`: the record no longer matches its digest (a token, a logprob, a body, a field). A
  later call whose prompt is read through an altered call's tokens is altered too, with
  `caused_by` naming the call it inherits the change from.
- `missing`: a seq is absent, a call follows one that is not in the store, or the call the
  rollout ended with is gone (the tail was cut).
- `reordered`: a record is intact but was chained after a different call than the one now
  before it (seqs swapped or renumbered).
- `hash`: a stored hash was changed while its record was not.
- `head`: the head sealed with the rollout does not match the chain.
- `unhashed`: a call without a digest or hash (recorded before the chain existed, or erased).
- `weights`: a call sealed with a weights digest that the engines' checksums stored for its
  version (the weight_checksum table) do not give: the record of which weights served it no
  longer holds.

`weights` lists, per weight version the calls were served with, how many calls, the digest of
the weights they were sealed with, and how many engines' checksums the store holds for it.

Calls the proxy refused (budget spent, rollout finished, key revoked, a malformed request) are
`rejected` rows in the same chain; they are listed in `refused` for the auditor.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from ..store import chain, compress
from ..store.delta import StoredPrompt, rebuild_prompts
from ..store.errors import NotFound
from ..store.models import (
    CallStatus,
    RolloutStatus,
    call_body_table,
    call_table,
    choice_table,
    rollout_table,
    weight_checksum_table,
)
from ..store.packing import IdArray, pack, unpack_ids
from ..store.weights import version_digest

if TYPE_CHECKING:
    from ..store.store import Store

__all__ = [
    "Issue",
    "IssueKind",
    "RefusedCall",
    "RolloutIntegrity",
    "WeightsServed",
    "verify_rollout",
    "verify_snapshot",
]

C, CH, B, R = call_table, choice_table, call_body_table, rollout_table
W = weight_checksum_table


class IssueKind(enum.StrEnum):
    ALTERED = "altered"
    MISSING = "missing"
    REORDERED = "reordered"
    HASH = "hash"
    HEAD = "head"
    UNHASHED = "unhashed"
    WEIGHTS = "weights"


@dataclass(frozen=True)
class WeightsServed:
    """The weights a rollout's calls under one version were served with."""

    weight_version: str | None
    calls: int
    digest: str | None
    """The weights digest the calls were sealed with; None where no engine offered checksums."""
    engines: int
    """How many engines' checksums of this version the store holds."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "weight_version": self.weight_version,
            "calls": self.calls,
            "digest": self.digest,
            "engines": self.engines,
        }


@dataclass(frozen=True)
class Issue:
    kind: IssueKind
    message: str
    seq: int | None = None
    call_id: str | None = None
    caused_by: str | None = None
    """For a call altered only through another call's tokens: that call's id."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "seq": self.seq,
            "call_id": self.call_id,
            "caused_by": self.caused_by,
            "message": self.message,
        }


@dataclass(frozen=True)
class RefusedCall:
    """A request the proxy answered with an error before (or instead of) sampling."""

    call_id: str
    seq: int
    http_status: int | None
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "seq": self.seq,
            "http_status": self.http_status,
            "error": self.error,
        }


@dataclass(frozen=True)
class RolloutIntegrity:
    rollout_id: str
    status: RolloutStatus
    calls: int
    head_hash: str | None
    """The head sealed when the rollout ended; None while it runs."""
    head_seq: int | None
    chain_hash: str | None
    """The stored hash of the last call now in the store (the chain's current end)."""
    after_head: int
    """Calls recorded after the rollout ended (refused ones, typically)."""
    issues: tuple[Issue, ...]
    refused: tuple[RefusedCall, ...]
    weights: tuple[WeightsServed, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.issues

    @property
    def sealed(self) -> bool:
        return self.head_hash is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "status": self.status.value,
            "ok": self.ok,
            "calls": self.calls,
            "sealed": self.sealed,
            "head_hash": self.head_hash,
            "head_seq": self.head_seq,
            "chain_hash": self.chain_hash,
            "after_head": self.after_head,
            "issues": [i.as_dict() for i in self.issues],
            "refused": [r.as_dict() for r in self.refused],
            "weights": [w.as_dict() for w in self.weights],
        }


@dataclass
class _Call:
    row: Mapping[str, Any]
    choices: list[Mapping[str, Any]]
    bodies: tuple[bytes | None, ...] | None
    """Body digests; None when a body could not be decompressed."""

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def seq(self) -> int:
        return int(self.row["seq"])

    def name(self) -> str:
        return f"call {self.id} (seq {self.seq})"


async def verify_rollout(store: Store, rollout_id: str) -> RolloutIntegrity:
    """Recompute a rollout's hash chain from what the store holds, in one read."""
    return await store.db.read(verify_snapshot, rollout_id)


def verify_snapshot(conn: Connection, rollout_id: str) -> RolloutIntegrity:
    """Recompute a rollout's chain from what the store holds now (a query function, like
    store.queries: run it in one snapshot)."""
    rollout = conn.execute(
        select(R.c.status, R.c.head_hash, R.c.head_seq, R.c.hack_flags).where(R.c.id == rollout_id)
    ).first()
    if rollout is None:
        raise NotFound(f"no rollout {rollout_id!r}")
    calls = _load(conn, rollout_id)
    issues = _check_records(calls)
    chainable = {c.id for c in calls if _chainable(c)}
    flags = rollout.hack_flags or None
    link_issues, true_hashes = _check_links(calls, chainable, rollout.head_hash, flags)
    issues += link_issues
    head_issue, after_head = _check_head(
        rollout.head_hash, rollout.head_seq, calls, true_hashes, flags
    )
    if head_issue is not None:
        issues.append(head_issue)
    served, weight_issues = _check_weights(conn, calls)
    issues += weight_issues
    issues.sort(key=lambda i: (i.seq is None, i.seq or 0))
    refused = tuple(
        RefusedCall(c.id, c.seq, c.row["http_status"], c.row["error"])
        for c in calls
        if c.row["status"] == CallStatus.REJECTED.value
    )
    return RolloutIntegrity(
        rollout_id=rollout_id,
        status=RolloutStatus(rollout.status),
        calls=len(calls),
        head_hash=rollout.head_hash,
        head_seq=rollout.head_seq,
        chain_hash=calls[-1].row["hash"] if calls else None,
        after_head=after_head,
        issues=tuple(issues),
        refused=refused,
        weights=served,
    )


def _check_weights(
    conn: Connection, calls: Sequence[_Call]
) -> tuple[tuple[WeightsServed, ...], list[Issue]]:
    """Per version, the weights its calls were sealed with, checked against the checksums the
    store holds for it (store/weights.py)."""
    counts: dict[tuple[str | None, str | None], int] = {}
    for call in calls:
        if call.row["status"] == CallStatus.OK.value:
            key = (call.row["weight_version"], call.row["weights_digest"])
            counts[key] = counts.get(key, 0) + 1
    versions = {v for v, _ in counts if v is not None}
    stored: dict[str, list[str]] = {}
    if versions:
        rows = conn.execute(
            select(W.c.weight_version, W.c.checksums).where(
                W.c.weight_version.in_(sorted(versions))
            )
        )
        for version, sums in rows:
            # Recomputed from the checksums as stored now: an altered checksum shows.
            stored.setdefault(version, []).append(chain.checksums_digest(sums))
    served = tuple(
        WeightsServed(version, n, digest, len(stored.get(version or "", [])))
        for (version, digest), n in counts.items()
    )
    issues = []
    for call in calls:
        digest, version = call.row["weights_digest"], call.row["weight_version"]
        if digest is None:
            continue
        found = stored.get(version or "")
        if not found or version_digest(found) != digest:
            issues.append(
                Issue(
                    IssueKind.WEIGHTS,
                    f"sealed with weights {digest[:16]} for version {version!r}, which the "
                    "stored checksums of that version do not give",
                    call.seq,
                    call.id,
                )
            )
    return served, issues


def _chainable(call: _Call) -> bool:
    digest, stored = call.row["digest"], call.row["hash"]
    return chain.is_hex_digest(digest) and chain.is_hex_digest(stored)


def _check_records(calls: Sequence[_Call]) -> list[Issue]:
    """Each record against its own digest."""
    prompts = _prompts(calls)
    issues: list[Issue] = []
    altered: dict[str, str | None] = {}
    """Calls found altered, with the call each inherits its change from (None: its own)."""
    for call in calls:
        if call.row["digest"] is None or call.row["hash"] is None:
            message = f"{call.name()}: no digest or hash"
            issues.append(Issue(IssueKind.UNHASHED, message, call.seq, call.id))
            continue
        if not _chainable(call):
            message = f"{call.name()}: its stored digest or hash is not a SHA-256"
            issues.append(Issue(IssueKind.HASH, message, call.seq, call.id))
            continue
        digest = _digest(call, prompts.get(call.id))
        if digest is None or digest.hex() != call.row["digest"]:
            issue = _altered(call, prompts, calls, altered)
            altered[call.id] = issue.caused_by
            issues.append(issue)
    return issues


def _check_links(
    calls: Sequence[_Call],
    chainable: set[str],
    head_hash: str | None,
    flags: list[dict[str, Any]] | None,
) -> tuple[list[Issue], dict[str, bytes]]:
    """Each link against the call before it: (issues, each call's hash as it should be)."""
    issues: list[Issue] = []
    true_hashes: dict[str, bytes] = {}
    prev = chain.GENESIS
    """What the next call must chain to: the true hash of the one before, where it is known."""
    before: _Call | None = None
    for i, call in enumerate(calls):
        expected_seq = before.seq + 1 if before is not None else 1
        gap = call.seq > expected_seq
        if gap:
            issues.append(_missing_seqs(expected_seq, call, before))
        if call.id not in chainable:
            prev, before = chain.GENESIS, call  # as the writer chains after a hashless call
            continue
        expected = chain.link(prev, bytes.fromhex(call.row["digest"]))
        true_hashes[call.id] = expected
        stored = call.row["hash"]
        prev, before = expected, call
        if expected.hex() == stored:
            continue
        after = calls[i + 1] if i + 1 < len(calls) else None
        sealed = after is None and head_hash == chain.sealed_head(expected.hex(), flags)
        if _links_to(after, expected, chainable) or sealed:
            # What follows chains to the hash it should have: only its stored copy changed.
            message = f"{call.name()}: its stored hash was changed"
            issues.append(Issue(IssueKind.HASH, message, call.seq, call.id))
            continue
        # The record moved, or what it followed is gone; the next link is judged on its own.
        prev = bytes.fromhex(stored)
        if not gap:
            issues.append(_broken_link(call, calls[i - 1] if i else None, calls))
    return issues, true_hashes


def _links_to(call: _Call | None, prev: bytes, chainable: set[str]) -> bool:
    if call is None or call.id not in chainable:
        return False
    return bool(chain.link(prev, bytes.fromhex(call.row["digest"])).hex() == call.row["hash"])


def _load(conn: Connection, rollout_id: str) -> list[_Call]:
    rows = conn.execute(select(C).where(C.c.rollout_id == rollout_id).order_by(C.c.seq))
    calls = {row.id: _Call(dict(row._mapping), [], (None, None, None)) for row in rows}
    choice_rows = conn.execute(
        select(CH)
        .join(C, C.c.id == CH.c.call_id)
        .where(C.c.rollout_id == rollout_id)
        .order_by(C.c.seq, CH.c.idx)
    )
    for row in choice_rows:
        if row.call_id in calls:
            calls[row.call_id].choices.append(dict(row._mapping))
    body_rows = conn.execute(
        select(B).join(C, C.c.id == B.c.call_id).where(C.c.rollout_id == rollout_id)
    )
    for row in body_rows:
        if row.call_id not in calls:
            continue
        try:
            raw = [
                compress.inflate(blob) for blob in (row.request, row.engine_request, row.response)
            ]
        except compress.UNREADABLE:
            calls[row.call_id].bodies = None
            continue
        calls[row.call_id].bodies = tuple(chain.body_digest(b) for b in raw)
    return list(calls.values())


def _prompts(calls: Sequence[_Call]) -> dict[str, IdArray]:
    """Each call's full prompt rebuilt from the stored deltas; left out where it cannot be."""
    stored: list[StoredPrompt] = []
    completions: dict[tuple[str, int], IdArray] = {}
    for call in calls:
        for choice in call.choices:
            try:
                completions[(call.id, int(choice["idx"]))] = unpack_ids(choice["token_ids"])
            except ValueError:
                continue  # a blob cut to a length no int32 array has: left out
        row = call.row
        try:
            suffix = unpack_ids(row["prompt_suffix"])
        except ValueError:
            continue
        parent = row["prompt_parent_id"]
        stored.append(
            StoredPrompt(call.id, parent, row["prompt_parent_choice"], row["prompt_shared"], suffix)
        )
    return rebuild_prompts(_parents_first(stored), completions, lenient=True)


def _parents_first(stored: Sequence[StoredPrompt]) -> list[StoredPrompt]:
    """Seq order with each parent moved before its children: seqs may have been reordered."""
    by_id = {s.call_id: s for s in stored}
    ordered: list[StoredPrompt] = []
    placed: set[str] = set()
    for start in stored:
        path = []
        node: StoredPrompt | None = start
        while node is not None and node.call_id not in placed and node not in path:
            path.append(node)
            node = by_id.get(node.parent_id) if node.parent_id is not None else None
        for item in reversed(path):
            placed.add(item.call_id)
            ordered.append(item)
    return ordered


def _digest(call: _Call, prompt: IdArray | None) -> bytes | None:
    if prompt is None or call.bodies is None:
        return None
    return chain.call_digest(call.row, pack(prompt), call.choices, call.bodies)


def _altered(
    call: _Call,
    prompts: Mapping[str, IdArray],
    calls: Sequence[_Call],
    altered: Mapping[str, str | None],
) -> Issue:
    if call.bodies is None:
        why = "a stored body cannot be decompressed"
    elif call.id not in prompts:
        why = "its prompt cannot be rebuilt from the stored tokens"
    else:
        why = "the record does not match its digest"
    # The nearest prompt ancestor found altered: this call's prompt is read through its tokens.
    by_id = {c.id: c for c in calls}
    ancestor = call.row["prompt_parent_id"]
    while ancestor is not None and ancestor not in altered:
        parent = by_id.get(ancestor)
        ancestor = None if parent is None else parent.row["prompt_parent_id"]
    if ancestor is not None:
        ancestor = altered[ancestor] or ancestor
        why += f"; its prompt is read through the tokens of altered call {ancestor}"
    elif call.row["prompt_parent_id"] is not None and call.row["prompt_parent_id"] not in by_id:
        why += f"; its prompt's parent call {call.row['prompt_parent_id']} is missing"
    return Issue(IssueKind.ALTERED, f"{call.name()}: {why}", call.seq, call.id, ancestor)


def _missing_seqs(first: int, call: _Call, before: _Call | None) -> Issue:
    gap = f"seq {first}" if call.seq == first + 1 else f"seqs {first}-{call.seq - 1}"
    after = "the start" if before is None else before.name()
    return Issue(
        IssueKind.MISSING,
        f"{gap} missing: {call.name()} follows {after}",
        first,
        call.id,
    )


def _broken_link(call: _Call, before: _Call | None, calls: Sequence[_Call]) -> Issue:
    """Why a call does not chain to the call before it: it was moved, or what it followed is
    gone."""
    digest = bytes.fromhex(call.row["digest"])
    stored = call.row["hash"]
    now_after = "the start" if before is None else before.name()
    if chain.link(chain.GENESIS, digest).hex() == stored:
        message = f"{call.name()} was recorded as the first call; now it follows {now_after}"
        return Issue(IssueKind.REORDERED, message, call.seq, call.id)
    for other in calls:
        if other is call or not _chainable(other):
            continue
        if chain.link(bytes.fromhex(other.row["hash"]), digest).hex() == stored:
            message = (
                f"{call.name()} was recorded right after {other.name()}; now it follows {now_after}"
            )
            return Issue(IssueKind.REORDERED, message, call.seq, call.id)
    message = f"{call.name()} follows a call that is not in the store (deleted, or moved away)"
    return Issue(IssueKind.MISSING, message, call.seq, call.id)


def _check_head(
    head_hash: str | None,
    head_seq: int | None,
    calls: Sequence[_Call],
    true_hashes: Mapping[str, bytes],
    flags: list[dict[str, Any]] | None = None,
) -> tuple[Issue | None, int]:
    """(an issue with the sealed head, the number of calls recorded after it). The head seals
    the hack flags too, when there are any (chain.py)."""
    if head_hash is None or head_seq is None:
        return None, 0
    after = sum(1 for c in calls if c.seq > head_seq)
    if head_seq == 0:
        if head_hash != chain.sealed_head(chain.GENESIS_HEX, flags):
            message = "the sealed head is not that of an empty chain" + _and_flags(flags)
            return Issue(IssueKind.HEAD, message), after
        return None, after
    at_head = next((c for c in calls if c.seq == head_seq), None)
    if at_head is None:
        last = calls[-1].seq if calls else 0
        message = f"the rollout ended with seq {head_seq}, but the store's calls end at seq {last}"
        if any(c.seq > head_seq for c in calls):
            message = f"seq {head_seq}, the call the rollout ended with, is missing"
        return Issue(IssueKind.MISSING, message, head_seq), after
    true_hash = true_hashes.get(at_head.id)
    sealed = {chain.sealed_head(at_head.row["hash"] or chain.GENESIS_HEX, flags)}
    if true_hash is not None:
        sealed.add(chain.sealed_head(true_hash.hex(), flags))
    if head_hash not in sealed:
        return (
            Issue(
                IssueKind.HEAD,
                f"the head sealed with the rollout does not match {at_head.name()}"
                + _and_flags(flags),
                head_seq,
                at_head.id,
            ),
            after,
        )
    return None, after


def _and_flags(flags: list[dict[str, Any]] | None) -> str:
    return f" and its {len(flags)} hack flag{'s' * (len(flags) != 1)}" if flags else ""
