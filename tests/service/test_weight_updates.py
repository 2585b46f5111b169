"""A weight update in the middle of a batch on the real service: calls are held, none fails,
every recorded call carries the version it was sampled with, a rollout that straddles the
update reports both versions, and `max_staleness` drops or flags what is too old."""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from pathlib import Path

from rolltap.analysis.steps import TurnKind
from rolltap.client import Dropped, Group
from rolltap.runner.sandboxes.workspace import label
from rolltap.store import CallStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.service import RunningService, running_service
from tests.support.waiting import until

# Two chained turns (the second call's prompt extends the first call's plus its answer), with a
# pause between them long enough for the test to update the weights in it.
TWO_TURNS = """
python3 - <<'PY'
import json, os, time, urllib.request

def ask(messages):
    body = {"model": os.environ["ROLLTAP_MODEL"], "messages": messages}
    request = urllib.request.Request(
        os.environ["ROLLTAP_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["ROLLTAP_KEY"]})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]["content"]

history = [{"role": "user", "content": "first question"}]
history.append({"role": "assistant", "content": ask(history)})
while not os.path.exists("/tmp/go-on"):
    time.sleep(0.05)
history.append({"role": "user", "content": "the tool said: 42"})
open("answer.txt", "w").write(ask(history))
PY
"""

TASKS = [
    {"id": f"t{i}", "instruction": "two turns", "test": "grep -q yes answer.txt"} for i in range(2)
]


async def _first_turns_done(service: RunningService, store: Store, batch_id: str) -> None:
    async def done() -> bool:
        views = await store.rollouts(batch=batch_id)
        return len(views) == 4 and all(v.n_calls == 1 for v in views)

    await until(done, "every rollout made its first call")


def _release(*batch_ids: str) -> None:
    """Let every rollout's harness go on to its second turn: the file goes in each sandbox's
    private /tmp, which is its workspace's fs/tmp on the host."""
    for batch_id in batch_ids:
        # Each run's sandboxes are under BATCH.TOKEN (runner/lease.py `sandbox_run_id`).
        for tmp in (Path(tempfile.gettempdir()) / "rolltap-bwrap").glob(
            f"{label(batch_id)}.*/*/fs/tmp"
        ):
            (tmp / "go-on").touch()


async def test_an_update_mid_batch_holds_calls_fails_none_and_stamps_both_versions(
    store: Store, tmp_path: Path
) -> None:
    """drain: the second turns reach the proxy during the update and wait for it."""
    fake = FakeVLLM(script=lambda body: Reply(text="yes"))
    async with (
        fake_engine(fake) as engine,
        running_service(
            store,
            engine.url,
            logs=tmp_path / "logs",
            scripts={"two-turns": TWO_TURNS},
            weight_version="1",
        ) as service,
    ):
        client = service.client
        batch = await client.submit(
            TASKS, harness="two-turns", samples_per_task=2, batch_id=f"w-{secrets.token_hex(3)}"
        )
        await _first_turns_done(service, store, batch.id)
        async with client.weight_update("2", mode="drain") as update:
            assert update.began["drained"] is True
            _release(batch.id)
            # Every second turn reaches the proxy and waits there: none is refused.
            await until(
                lambda: _async(service.proxy.ctx.hold.waiting == 4), "all second turns held"
            )
            assert len(fake.requests) == 4
        assert update.committed is not None
        assert update.committed["weight_version"] == "2"
        groups = [g async for g in client.groups(batch.id)]

    calls = [c for v in await store.rollouts(batch=batch.id) for c in await store.calls(v.id)]
    assert len(calls) == 8
    assert all(c.status is CallStatus.OK for c in calls)
    for view in await store.rollouts(batch=batch.id):
        first, second = sorted(await store.calls(view.id), key=lambda c: c.seq)
        assert (first.weight_version, second.weight_version) == ("1", "2")
    assert len(groups) == 2
    for group in groups:
        for sample in group.samples:
            assert (sample.min_version, sample.max_version) == ("1", "2")
            (trajectory,) = sample.trajectories
            assert (trajectory.min_version, trajectory.max_version) == ("1", "2")
            assert trajectory.weight_versions == ["1", "2"]
            kinds = [(t.kind, t.weight_version) for t in trajectory.turns]
            assert kinds == [
                (TurnKind.ANSWER.value, "1"),
                (TurnKind.OBSERVATION.value, None),
                (TurnKind.ANSWER.value, "2"),
            ]
            assert sample.staleness == 1


async def test_an_abort_resume_update_mid_answer_fails_no_call_and_splits_the_answer(
    store: Store, tmp_path: Path
) -> None:
    """abort_resume: the second turns are being answered when the update begins; each answer
    is cut, recorded with version 1, continued with version 2, and the harness never notices."""
    answer = "yes " * 30
    fake = FakeVLLM(script=lambda body: Reply(text=answer), token_delay=0.02)
    async with (
        fake_engine(fake) as engine,
        running_service(
            store,
            engine.url,
            logs=tmp_path / "logs",
            scripts={"two-turns": TWO_TURNS},
            weight_version="1",
        ) as service,
    ):
        client = service.client
        batch = await client.submit(
            TASKS, harness="two-turns", samples_per_task=2, batch_id=f"a-{secrets.token_hex(3)}"
        )
        await _first_turns_done(service, store, batch.id)
        _release(batch.id)
        await until(lambda: _async(len(fake.requests) == 8), "every second turn being answered")
        await asyncio.sleep(0.2)
        async with client.weight_update("2", mode="abort_resume") as update:
            assert update.began["drained"] is True
        groups = [g async for g in client.groups(batch.id)]

    assert fake.aborts == 1
    for view in await store.rollouts(batch=batch.id):
        calls = sorted(await store.calls(view.id), key=lambda c: c.seq)
        assert [c.status for c in calls] == [CallStatus.OK] * 3
        assert [c.weight_version for c in calls] == ["1", "1", "2"]
        assert [c.finish_reason for c in calls] == ["stop", "abort", "stop"]
        assert calls[2].resumes == calls[1].id
        assert view.reward == 1.0, "the harness got its whole answer"
    for group in groups:
        for sample in group.samples:
            (trajectory,) = sample.trajectories
            assert [(t.kind, t.weight_version) for t in trajectory.turns] == [
                (TurnKind.ANSWER.value, "1"),
                (TurnKind.OBSERVATION.value, None),
                (TurnKind.ANSWER.value, "1"),
                (TurnKind.ANSWER.value, "2"),
            ]
            assert (sample.min_version, sample.max_version) == ("1", "2")


async def test_max_staleness_drops_or_flags_groups_older_than_allowed(
    store: Store, tmp_path: Path
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text="yes"))
    async with (
        fake_engine(fake) as engine,
        running_service(
            store,
            engine.url,
            logs=tmp_path / "logs",
            scripts={"two-turns": TWO_TURNS},
            weight_version="1",
        ) as service,
    ):
        client = service.client
        dropping = await client.submit(
            TASKS[:1], harness="two-turns", samples_per_task=2, max_staleness=0
        )
        flagging = await client.submit(
            TASKS[1:], harness="two-turns", samples_per_task=2, max_staleness=0, stale="flag"
        )
        await _first_turns_done_of(store, [dropping.id, flagging.id])
        async with client.weight_update("2"):
            pass
        _release(dropping.id, flagging.id)
        dropped = [e async for e in client.events(dropping.id)]
        flagged = [g async for g in client.groups(flagging.id)]

    assert [(type(e).__name__, getattr(e, "reason", None)) for e in dropped[:-1]] == [
        ("Dropped", "stale")
    ]
    assert isinstance(dropped[0], Dropped)
    (group,) = flagged
    assert isinstance(group, Group)
    assert group.stale
    assert all(s.stale and s.staleness == 1 for s in group.samples)


async def _first_turns_done_of(store: Store, batch_ids: list[str]) -> None:
    async def done() -> bool:
        views = [v for b in batch_ids for v in await store.rollouts(batch=b)]
        return len(views) == 4 and all(v.n_calls == 1 for v in views)

    await until(done, "every rollout made its first call")


async def _async(value: bool) -> bool:
    return value
