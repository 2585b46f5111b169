"""`max_staleness` held where calls are dispatched, on the real service: a batch runs harnesses
that make three calls each, an abort_resume update commits while they are mid-episode, and the
rollout's next dispatch (the continuation of a call the update cut, or its next call) finds it
one version behind a bound of 0. flag lets it go on, marked; drop refuses the call in the chat
client's error shape and ends the rollout, its group dropped as stale; relaunch ends it too and
runs the sample again as a new attempt on the new weights."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rolltap.client import Dropped, Group
from rolltap.runner.sandboxes.workspace import label
from rolltap.store import CallStatus, RolloutStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.service import RunningService, running_service
from tests.support.waiting import until

# Three chained turns. An instruction of "wait" holds the harness after its first turn until
# the test drops /tmp/go-on into its sandbox. A refused call ends it, its error on stderr.
THREE_TURNS = """
python3 - <<'PY'
import json, os, sys, time, urllib.error, urllib.request

def ask(messages):
    body = {"model": os.environ["ROLLTAP_MODEL"], "messages": messages}
    request = urllib.request.Request(
        os.environ["ROLLTAP_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["ROLLTAP_KEY"]})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as e:
        print("refused", e.code, e.read().decode(), file=sys.stderr)
        sys.exit(3)

history = [{"role": "user", "content": "turn 1"}]
history.append({"role": "assistant", "content": ask(history)})
while os.environ["ROLLTAP_INSTRUCTION"] == "wait" and not os.path.exists("/tmp/go-on"):
    time.sleep(0.05)
history.append({"role": "user", "content": "turn 2"})
history.append({"role": "assistant", "content": ask(history)})
history.append({"role": "user", "content": "turn 3"})
open("answer.txt", "w").write(ask(history))
PY
"""

LONG_TURN = "turn 2"


def _engine() -> FakeVLLM:
    """Answers "yes"; the second turn slowly, so an update can cut it."""

    def answer(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["content"] == LONG_TURN:
            return Reply(text="yes " * 40, token_delay=0.04)
        return Reply(text="yes")

    return FakeVLLM(script=answer)


def _task(instruction: str) -> list[dict[str, str]]:
    return [{"id": "t", "instruction": instruction, "test": "grep -q yes answer.txt"}]


def _long_turns(fake: FakeVLLM) -> int:
    return sum(
        1
        for path, _, body in fake.requests
        if path.endswith("/chat/completions") and body["messages"][-1]["content"] == LONG_TURN
    )


async def _update(service: RunningService, version: str) -> None:
    async with service.client.weight_update(version, mode="abort_resume") as update:
        assert update.began["drained"] is True


async def _mid_answer_update(service: RunningService, fake: FakeVLLM, rollouts: int) -> None:
    """Once every rollout's second turn is being answered, commit version 2 in abort_resume
    mode: each answer is cut, and its continuation is the rollout's next dispatch."""

    async def answering() -> bool:
        return _long_turns(fake) == rollouts

    await until(answering, "every second turn being answered")
    await asyncio.sleep(0.3)  # some tokens sampled, most still to come
    await _update(service, "2")


@contextlib.asynccontextmanager
async def _three_turn_service(
    store: Store, tmp_path: Path
) -> AsyncIterator[tuple[FakeVLLM, RunningService]]:
    """The service on version 1 in front of `_engine()`, with the three-turn scripted harness."""
    fake = _engine()
    async with (
        fake_engine(fake) as engine,
        running_service(
            store,
            engine.url,
            logs=tmp_path / "logs",
            scripts={"three-turns": THREE_TURNS},
            weight_version="1",
        ) as service,
    ):
        yield fake, service


async def _sorted_calls(store: Store, rollout_id: str) -> list[Any]:
    return sorted(await store.calls(rollout_id), key=lambda c: c.seq)


async def test_flag_lets_the_calls_go_on_and_marks_the_rollout_and_its_sample(
    store: Store, tmp_path: Path
) -> None:
    async with _three_turn_service(store, tmp_path) as (fake, service):
        batch = await service.client.submit(
            _task("go"), harness="three-turns", samples_per_task=2, max_staleness=0, stale="flag"
        )
        await _mid_answer_update(service, fake, 2)
        (group,) = [g async for g in service.client.groups(batch.id)]

    assert fake.aborts == 1
    for view in await store.rollouts(batch=batch.id):
        calls = await _sorted_calls(store, view.id)
        # The cut answer went on on version 2, and so did the third turn.
        assert [c.status for c in calls] == [CallStatus.OK] * 4
        assert [c.weight_version for c in calls] == ["1", "1", "2", "2"]
        assert view.status is RolloutStatus.SUCCEEDED
        assert view.meta["stale"] == {
            "action": "flag",
            "gap": 1,
            "max_staleness": 0,
            "oldest_version": "1",
            "version": "2",
        }
    assert isinstance(group, Group)
    assert group.stale
    assert [(s.stale, s.staleness, s.stale_action) for s in group.samples] == [
        (True, 1, "flag")
    ] * 2
    assert group.rewards == [1.0, 1.0]


async def test_drop_refuses_the_next_call_in_the_client_s_shape_and_drops_the_group(
    store: Store, tmp_path: Path
) -> None:
    """The update commits between two calls (every harness waits after its first): each
    rollout's second call is refused before any engine sees it."""
    async with _three_turn_service(store, tmp_path) as (fake, service):
        batch = await service.client.submit(
            _task("wait"),
            harness="three-turns",
            samples_per_task=2,
            max_staleness=0,
            stale="drop",
            batch_id=f"drop-{secrets.token_hex(3)}",
        )

        async def first_calls_done() -> bool:
            views = await store.rollouts(batch=batch.id)
            return len(views) == 2 and all(v.n_calls == 1 for v in views)

        await until(first_calls_done, "every rollout made its first call")
        await _update(service, "2")
        _release(batch.id)
        events = [e async for e in service.client.events(batch.id)]

    assert [(type(e).__name__, getattr(e, "reason", None)) for e in events[:-1]] == [
        ("Dropped", "stale")
    ]
    assert isinstance(events[0], Dropped)
    assert _long_turns(fake) == 0, "no second turn reached the engine"
    for view in await store.rollouts(batch=batch.id):
        first, second = await _sorted_calls(store, view.id)
        assert (first.status, first.weight_version) == (CallStatus.OK, "1")
        assert (second.status, second.http_status) == (CallStatus.REJECTED, 403)
        assert "is stale" in (second.error or "")
        assert view.status is RolloutStatus.CANCELLED
        assert view.error is not None
        assert "is stale" in view.error
        assert view.meta["stale"]["action"] == "drop"
        assert view.meta["stale"]["gap"] == 1
        # The harness got the refusal as an OpenAI client gets any: its error object.
        assert "refused 403" in view.meta["harness_tail"]
        assert '"type":"permission_error"' in view.meta["harness_tail"]
        assert '"code":"rollout_stale"' in view.meta["harness_tail"]


async def test_relaunch_stops_the_attempt_and_runs_the_sample_again_on_the_new_weights(
    store: Store, tmp_path: Path
) -> None:
    async with _three_turn_service(store, tmp_path) as (fake, service):
        batch = await service.client.submit(
            _task("go"),
            harness="three-turns",
            samples_per_task=2,
            max_staleness=0,
            stale="relaunch",
        )
        await _mid_answer_update(service, fake, 2)
        (group,) = [g async for g in service.client.groups(batch.id)]
        summary = (await service.client.batch(batch.id)).data

    views = {v.id: v for v in await store.rollouts(batch=batch.id)}
    stopped = [v for v in views.values() if v.attempt == 0]
    assert len(views) == 4
    assert len(stopped) == 2
    for old in stopped:
        calls = await _sorted_calls(store, old.id)
        # The cut answer's continuation was refused: nothing more ran on the old attempt.
        assert [(c.status, c.weight_version) for c in calls] == [
            (CallStatus.OK, "1"),
            (CallStatus.OK, "1"),
            (CallStatus.FAILED, "2"),
        ]
        assert calls[2].http_status == 403
        assert old.status is RolloutStatus.CANCELLED
        assert old.meta["stale"]["action"] == "relaunch"
        assert old.meta["stale"]["gap"] == 1
        new = views[old.meta["superseded_by"]]
        assert (new.attempt, new.sample_index) == (1, old.sample_index)
        assert new.meta["relaunch_of"] == old.id
        assert "stale" not in new.meta
        # The new attempt started afresh on the weights in force.
        assert [c.weight_version for c in await _sorted_calls(store, new.id)] == ["2"] * 3
        assert new.status is RolloutStatus.SUCCEEDED
    # The group holds the new attempts, judged on their own calls: not stale.
    assert not group.stale
    assert [(s.attempt, s.stale, s.staleness) for s in group.samples] == [(1, False, 0)] * 2
    assert {s.relaunch_of for s in group.samples} == {v.id for v in stopped}
    assert group.rewards == [1.0, 1.0]
    assert summary["relaunched_rollouts"] == 2
    # Only the continuation aborted by the update was not sent: 2 + 2 + 3 * 2 chat calls.
    assert sum(1 for path, _, _ in fake.requests if path.endswith("/completions")) == 10


async def test_a_sample_is_relaunched_at_most_max_relaunches_times(
    store: Store, tmp_path: Path
) -> None:
    """A trainer that updates faster than a rollout can finish within the bound must not
    relaunch a sample for ever: past `max_relaunches` it is kept as it ended."""
    async with _three_turn_service(store, tmp_path) as (fake, service):
        batch = await service.client.submit(
            _task("go"),
            harness="three-turns",
            samples_per_task=2,
            max_staleness=0,
            stale="relaunch",
            max_relaunches=0,
        )
        await _mid_answer_update(service, fake, 2)
        (group,) = [g async for g in service.client.groups(batch.id)]
        summary = (await service.client.batch(batch.id)).data

    views = await store.rollouts(batch=batch.id)
    assert [(v.attempt, v.status) for v in views] == [(0, RolloutStatus.CANCELLED)] * 2
    assert all(v.meta["stale"]["action"] == "relaunch" for v in views)
    assert all(s.stale for s in group.samples)
    assert summary["relaunched_rollouts"] == 0


async def test_an_unknown_stale_policy_is_refused_naming_the_choices(
    store: Store, tmp_path: Path
) -> None:
    body = {"tasks": _task("go"), "harness": "single-call", "max_staleness": 0, "stale": "skip"}
    async with (
        fake_engine() as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
        aiohttp.ClientSession() as session,
        session.post(f"{service.url}/v1/batches", json=body) as resp,
    ):
        status, error = resp.status, await resp.json()

    assert status == 400
    assert error["error"]["param"] == "stale"
    assert error["error"]["message"] == "'stale' must be one of drop, flag, relaunch"
    assert await store.rollouts() == []


@pytest.mark.parametrize("stale", ["flag", "drop", "relaunch"])
async def test_the_bound_goes_into_each_rollout_s_meta(
    store: Store, tmp_path: Path, stale: str
) -> None:
    async with (
        fake_engine() as engine,
        running_service(store, engine.url, logs=tmp_path / "logs") as service,
    ):
        batch = await service.client.submit(
            _task("go"), harness="single-call", max_staleness=1, stale=stale
        )
        _ = [g async for g in service.client.groups(batch.id)]

    (view,) = await store.rollouts(batch=batch.id)
    assert view.meta["staleness"] == {"max_staleness": 1, "stale": stale}
    assert batch.data["spec"]["stale"] == stale


def _release(batch_id: str) -> None:
    """Let every rollout's harness go on to its second turn: the file goes in each sandbox's
    private /tmp, which is its workspace's fs/tmp on the host."""
    # Each run's sandboxes are under BATCH.TOKEN (runner/lease.py `sandbox_run_id`).
    root = Path(tempfile.gettempdir()) / "rolltap-bwrap"
    for tmp in root.glob(f"{label(batch_id)}.*/*/fs/tmp"):
        (tmp / "go-on").touch()
