"""Bodies at rest: zstd now, and the zlib bodies stores hold from before still read and verify."""

from __future__ import annotations

import zlib

import pytest

from rolltap.audit.integrity import verify_rollout
from rolltap.store import NewRollout, Store, compress
from tests.support.records import call
from tests.support.tamper import fetch, tamper


@pytest.mark.parametrize("body", [b"", b"x", b'{"messages": [{"role": "user"}]}' * 200])
def test_a_body_comes_back_as_it_went_in(body: bytes) -> None:
    assert compress.inflate(compress.deflate(body)) == body
    assert compress.inflate(zlib.compress(body)) == body


def test_nothing_stays_nothing() -> None:
    assert compress.deflate(None) is None
    assert compress.inflate(None) is None


async def test_bodies_stored_as_zlib_before_still_read_and_verify(
    store: Store, db_url: str
) -> None:
    rollout = await store.create_rollout(NewRollout(task_id="t"))
    request, response = b'{"messages": ["hi"]}', b'{"choices": ["hello"]}'
    record = call(rollout.id, [5, 6, 7], [8, 9], request_body=request, response_body=response)
    call_id = (await store.append_call(record)).call_id
    stored = await fetch(db_url, "SELECT response FROM call_body WHERE call_id = :c", c=call_id)
    assert stored.startswith(b"\x28\xb5\x2f\xfd")  # a zstd frame
    # As a rolltap from before zstd wrote them.
    await tamper(
        db_url,
        "UPDATE call_body SET request = :q, response = :r WHERE call_id = :c",
        q=zlib.compress(request, 1),
        r=zlib.compress(response, 1),
        c=call_id,
    )

    bodies = await store.call_bodies(call_id)
    result = await verify_rollout(store, rollout.id)

    assert (bodies.request, bodies.response) == (request, response)
    assert result.ok, result.issues
