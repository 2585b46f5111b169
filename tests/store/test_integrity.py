"""The hash chain: every call is chained as it is written, a rollout's head is sealed when it
ends, and an attacker's edits made directly in the database are caught and the call named."""

from __future__ import annotations

import asyncio
import struct
import zlib

import numpy as np
import pytest

from rolltap.audit.integrity import IssueKind, RolloutIntegrity, verify_rollout
from rolltap.store import CallStatus, NewRollout, Store
from rolltap.store.chain import GENESIS_HEX, call_digest, encode, link
from rolltap.store.events import Declared
from tests.support.records import call
from tests.support.tamper import fetch, tamper


async def _agent_rollout(store: Store) -> tuple[str, list[str]]:
    """Five calls as an agent makes them: each prompt extends the last answer (stored as a delta
    of it), bodies on every call, two choices on one, and a refused request in the middle."""
    rollout = await store.create_rollout(NewRollout(task_id="t"))
    await store.report(rollout.id, Declared("running"))
    prompt = list(range(100, 140))
    ids = []
    for turn in range(4):
        answer = [1000 + 10 * turn + k for k in range(6)]
        extra = [[7, 7, turn]] if turn == 1 else []
        record = call(
            rollout.id,
            prompt,
            answer,
            *extra,
            request_body=b'{"messages": [%d]}' % turn,
            response_body=b'{"choices": ["turn %d"]}' % turn,
            usage={"prompt_tokens": len(prompt), "completion_tokens": 6},
        )
        ids.append((await store.append_call(record)).call_id)
        prompt = [*prompt, *answer, 900 + turn, 901]
        if turn == 1:
            refused = call(rollout.id, [], status=CallStatus.REJECTED, http_status=400)
            refused.error = "request body is not valid JSON"
            ids.append((await store.append_call(refused)).call_id)
    await store.report(rollout.id, Declared("finished"), reward=1.0)
    return rollout.id, ids


def _kinds(result: RolloutIntegrity) -> list[tuple[IssueKind, str | None]]:
    return [(i.kind, i.call_id) for i in result.issues]


async def test_an_untouched_rollout_verifies_and_its_head_is_sealed(store: Store) -> None:
    rollout_id, ids = await _agent_rollout(store)

    result = await verify_rollout(store, rollout_id)
    calls = await store.calls(rollout_id)
    view = await store.rollout(rollout_id)

    assert result.ok, result.issues
    assert (result.calls, result.sealed, result.head_seq) == (5, True, 5)
    assert view.head_hash == calls[-1].hash == result.chain_hash
    assert [c.id for c in calls] == ids
    assert [(r.call_id, r.seq, r.http_status) for r in result.refused] == [(ids[2], 3, 400)]
    # The chain as documented in store/chain.py: each hash links the digest to the one before.
    previous = bytes(32)
    for c in calls:
        assert c.digest is not None
        assert c.hash is not None
        assert link(previous, bytes.fromhex(c.digest)).hex() == c.hash
        previous = bytes.fromhex(c.hash)


async def test_the_digest_is_the_documented_encoding(store: Store) -> None:
    rollout = await store.create_rollout()
    record = call(rollout.id, [5, 6, 7], [8, 9], logprobs=[[-0.5, -0.25]], request_body=b"{}")
    await store.append_call(record)
    [stored] = await store.calls(rollout.id)

    row = {
        "id": stored.id,
        "rollout_id": rollout.id,
        "dialect": "chat",
        "purpose": None,
        "model": None,
        "backend": None,
        "status": "ok",
        "http_status": None,
        "error": None,
        "stream": False,
        "capture": "tokens",
        "received_at": record.received_at,
        "dispatched_at": None,
        "first_token_at": None,
        "finished_at": None,
        "weight_version": None,
        "finish_reason": "stop",
        "usage": None,
        "retry_count": 0,
        "body_hash": None,
        "retry_of": None,
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "n_choices": 1,
        "resumes": None,
        "bridge": None,
    }
    choice = {
        "idx": 0,
        "finish_reason": "stop",
        "n_tokens": 2,
        "token_ids": struct.pack("<2i", 8, 9),
        "logprobs": struct.pack("<2f", -0.5, -0.25),
    }
    import hashlib

    digest = call_digest(
        row, struct.pack("<3i", 5, 6, 7), [choice], [hashlib.sha256(b"{}").digest(), None, None]
    )

    assert stored.digest == digest.hex()
    assert stored.hash == link(bytes(32), digest).hex()
    assert encode(None) == b"N"
    assert encode(True) == b"T"
    assert encode(-1) == b"I" + b"\xff" * 8
    assert encode("é") == b"S" + (2).to_bytes(8, "big") + "é".encode()
    assert encode({"b": 1, "a": "é"}) == encode('{"a":"é","b":1}')


async def test_an_altered_token_is_caught_and_the_call_named(store: Store, db_url: str) -> None:
    rollout_id, ids = await _agent_rollout(store)
    blob = await fetch(
        db_url, "SELECT token_ids FROM choice WHERE call_id = :c AND idx = 0", c=ids[1]
    )
    ids_now = np.frombuffer(blob, dtype="<i4").copy()
    ids_now[2] = 4242
    await tamper(
        db_url,
        "UPDATE choice SET token_ids = :b WHERE call_id = :c AND idx = 0",
        b=ids_now.tobytes(),
        c=ids[1],
    )

    result = await verify_rollout(store, rollout_id)

    assert not result.ok
    first = result.issues[0]
    assert (first.kind, first.call_id, first.seq, first.caused_by) == (
        IssueKind.ALTERED,
        ids[1],
        2,
        None,
    )
    # The later prompts were stored as deltas of that answer: they read the altered token too.
    assert {(i.kind, i.call_id, i.caused_by) for i in result.issues[1:]} == {
        (IssueKind.ALTERED, ids[3], ids[1]),
        (IssueKind.ALTERED, ids[4], ids[1]),
    }


async def test_an_altered_logprob_and_an_altered_field_are_caught(
    store: Store, db_url: str
) -> None:
    rollout_id, ids = await _agent_rollout(store)
    lp = await fetch(db_url, "SELECT logprobs FROM choice WHERE call_id = :c AND idx = 1", c=ids[1])
    flipped = np.frombuffer(lp, dtype="<f4").copy()
    flipped[0] = -0.0001
    await tamper(
        db_url,
        "UPDATE choice SET logprobs = :b WHERE call_id = :c AND idx = 1",
        b=flipped.tobytes(),
        c=ids[1],
    )
    await tamper(db_url, "UPDATE call SET finish_reason = 'length' WHERE id = :c", c=ids[0])

    result = await verify_rollout(store, rollout_id)

    assert _kinds(result) == [(IssueKind.ALTERED, ids[0]), (IssueKind.ALTERED, ids[1])]


async def test_a_forged_resume_link_is_caught(store: Store, db_url: str) -> None:
    """`resumes` says which aborted answer a call continues; the trainer joins the two answers
    on it, so pointing it elsewhere must break the digest like any other field."""
    rollout_id, ids = await _agent_rollout(store)
    await tamper(db_url, "UPDATE call SET resumes = :r WHERE id = :c", r=ids[0], c=ids[2])

    result = await verify_rollout(store, rollout_id)

    assert _kinds(result) == [(IssueKind.ALTERED, ids[2])]


async def test_a_deleted_call_is_caught_and_named(store: Store, db_url: str) -> None:
    rollout_id, ids = await _agent_rollout(store)
    assert await tamper(db_url, "DELETE FROM call WHERE id = :c", c=ids[1]) == 1

    result = await verify_rollout(store, rollout_id)

    missing = result.issues[0]
    assert (missing.kind, missing.seq, missing.call_id) == (IssueKind.MISSING, 2, ids[2])
    assert "seq 2 missing" in missing.message
    assert ids[0] in missing.message
    # Its successor's prompt was a delta of it: that record cannot be read back whole either.
    assert (IssueKind.ALTERED, ids[3]) in _kinds(result)


async def test_a_cut_tail_is_caught_by_the_sealed_head(store: Store, db_url: str) -> None:
    rollout_id, ids = await _agent_rollout(store)
    await tamper(db_url, "DELETE FROM call WHERE id = :c", c=ids[-1])

    result = await verify_rollout(store, rollout_id)

    assert [(i.kind, i.seq) for i in result.issues] == [(IssueKind.MISSING, 5)]
    assert "ended with seq 5" in result.issues[0].message


async def test_two_swapped_calls_are_caught_and_named(store: Store, db_url: str) -> None:
    rollout_id, ids = await _agent_rollout(store)
    # Swap seqs 4 and 5 through a free value: (rollout_id, seq) is unique.
    await tamper(db_url, "UPDATE call SET seq = 99 WHERE id = :c", c=ids[3])
    await tamper(db_url, "UPDATE call SET seq = 4 WHERE id = :c", c=ids[4])
    await tamper(db_url, "UPDATE call SET seq = 5 WHERE id = :c", c=ids[3])

    result = await verify_rollout(store, rollout_id)

    assert {(i.kind, i.call_id) for i in result.issues} >= {
        (IssueKind.REORDERED, ids[4]),
        (IssueKind.REORDERED, ids[3]),
    }
    swapped = next(i for i in result.issues if i.call_id == ids[4])
    assert f"recorded right after call {ids[3]}" in swapped.message
    assert all(i.kind in (IssueKind.REORDERED, IssueKind.HEAD) for i in result.issues)


async def test_an_altered_body_is_caught_and_named(store: Store, db_url: str) -> None:
    rollout_id, ids = await _agent_rollout(store)
    forged = zlib.compress(b'{"choices": ["something else"]}')
    await tamper(
        db_url, "UPDATE call_body SET response = :b WHERE call_id = :c", b=forged, c=ids[3]
    )
    await tamper(
        db_url, "UPDATE call_body SET request = :b WHERE call_id = :c", b=b"junk", c=ids[0]
    )

    result = await verify_rollout(store, rollout_id)

    assert _kinds(result) == [(IssueKind.ALTERED, ids[0]), (IssueKind.ALTERED, ids[3])]
    assert "cannot be decompressed" in result.issues[0].message
    assert "does not match its digest" in result.issues[1].message


async def test_a_deleted_body_row_and_a_rewritten_hash_are_caught(
    store: Store, db_url: str
) -> None:
    rollout_id, ids = await _agent_rollout(store)
    await tamper(db_url, "DELETE FROM call_body WHERE call_id = :c", c=ids[0])
    await tamper(db_url, "UPDATE call SET hash = :h WHERE id = :c", h="ab" * 32, c=ids[3])

    result = await verify_rollout(store, rollout_id)

    assert _kinds(result) == [(IssueKind.ALTERED, ids[0]), (IssueKind.HASH, ids[3])]


async def test_a_rewritten_head_is_caught(store: Store, db_url: str) -> None:
    rollout_id, _ = await _agent_rollout(store)
    await tamper(
        db_url, "UPDATE rollout SET head_hash = :h WHERE id = :r", h="cd" * 32, r=rollout_id
    )

    result = await verify_rollout(store, rollout_id)

    assert [i.kind for i in result.issues] == [IssueKind.HEAD]


async def test_a_rollout_without_calls_seals_an_empty_chain(store: Store) -> None:
    rollout = await store.create_rollout()
    running = await verify_rollout(store, rollout.id)
    await store.report(rollout.id, Declared("failed"))

    ended = await verify_rollout(store, rollout.id)

    assert (running.sealed, running.ok) == (False, True)
    assert (ended.ok, ended.head_seq, ended.head_hash) == (True, 0, GENESIS_HEX)


async def test_calls_refused_after_the_end_follow_the_head(store: Store) -> None:
    rollout_id, _ = await _agent_rollout(store)
    late = call(rollout_id, [], status=CallStatus.REJECTED, http_status=403)
    late.error = "rollout is succeeded; it takes no more calls"
    receipt = await store.append_call(late)

    result = await verify_rollout(store, rollout_id)

    assert result.ok
    assert (result.head_seq, result.after_head) == (5, 1)
    assert result.refused[-1].call_id == receipt.call_id


@pytest.mark.parametrize("writers", [3])
async def test_writers_appending_to_one_rollout_keep_one_chain(db_url: str, writers: int) -> None:
    stores = [await Store.connect(db_url) for _ in range(writers)]
    try:
        rollout = await stores[0].create_rollout()

        async def append(store: Store, n: int) -> None:
            for i in range(n):
                await asyncio.gather(
                    *(store.append_call(call(rollout.id, [i, k], [k])) for k in range(4))
                )

        await asyncio.gather(*(append(s, 10) for s in stores))
        await stores[1].report(rollout.id, Declared("finished"))
        result = await verify_rollout(stores[2], rollout.id)
    finally:
        for s in stores:
            await s.close()

    assert result.ok, result.issues
    assert (result.calls, result.head_seq) == (writers * 40, writers * 40)


async def test_a_junk_hash_is_named_and_the_rollout_still_records(
    store: Store, db_url: str
) -> None:
    rollout = await store.create_rollout()
    first = await store.append_call(call(rollout.id, [1, 2], [3]))
    await tamper(db_url, "UPDATE call SET hash = 'not a hash' WHERE id = :c", c=first.call_id)

    after = await store.append_call(call(rollout.id, [1, 2, 3, 4], [5]))
    result = await verify_rollout(store, rollout.id)

    assert after.seq == 2
    assert _kinds(result) == [(IssueKind.HASH, first.call_id)]
