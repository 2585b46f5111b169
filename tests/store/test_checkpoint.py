"""SQLite's WAL is checkpointed by the store's own thread, not inside the writer's commits."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from rolltap.store import Store
from tests.support.records import call
from tests.support.stores import opened_store

PAGE_BYTES = 4096
WAL_PAGES = 3000  # three times the 1,000 pages at which SQLite's automatic checkpoint would run


async def _fill(store: Store, total_bytes: int) -> None:
    rollout = await store.create_rollout()
    per_call = 64 * 1024
    # Random bytes: zlib cannot shrink them, so the database really grows by this much.
    await asyncio.gather(
        *(
            store.append_call(call(rollout.id, [1, 2], [3], request_body=os.urandom(per_call)))
            for _ in range(total_bytes // per_call)
        )
    )


async def test_committed_data_reaches_the_database_file_while_the_store_is_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.sqlite"
    async with opened_store(f"sqlite:///{path}") as store:
        written = WAL_PAGES * PAGE_BYTES
        await _fill(store, written)
        # Everything committed is in the WAL at once; the checkpointer moves it into the main
        # file soon after, with no further commit to trigger it.
        deadline = time.monotonic() + 15
        while path.stat().st_size < written and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert path.stat().st_size >= written


async def test_data_survives_close_and_reopen_after_checkpoints(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    async with opened_store(url) as store:
        await _fill(store, 2 * 1024 * 1024)
        rollout_id = (await store.rollouts())[0].id
    async with opened_store(url) as reopened:
        assert len(await reopened.calls(rollout_id)) == 32
