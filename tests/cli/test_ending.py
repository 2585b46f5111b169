"""`rolltap finish` and `rolltap cancel` end a rollout a harness ran by hand, through the command
as a user runs it, on SQLite and PostgreSQL: the store holds the ending and the reward, an id
prefix names the rollout, and what the rollout's life forbids is one line."""

from __future__ import annotations

from pathlib import Path

from rolltap.store import NewRollout, RolloutStatus
from rolltap.store.events import Started
from tests.cli.test_mistakes import one_line_error
from tests.support.cli import rolltap
from tests.support.stores import opened_store


async def test_finish_and_cancel_end_rollouts(db_url: str, tmp_path: Path) -> None:
    async with opened_store(db_url) as store:
        ran = await store.create_rollout(NewRollout(task_id="by-hand"))
        await store.report(ran.id, Started())
        left = await store.create_rollout(NewRollout(task_id="left"))

    done = rolltap(tmp_path, "finish", ran.id[:12], "--reward", "0.5", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"rollout {ran.id} finished, reward 0.5"
    cancelled = rolltap(tmp_path, "cancel", left.id, "--db", db_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"rollout {left.id} cancelled"

    async with opened_store(db_url) as store:
        finished = await store.rollout(ran.id)
        assert finished.status == RolloutStatus.FINISHED
        assert finished.reward == 0.5
        assert finished.finished_at is not None
        assert (await store.rollout(left.id)).status == RolloutStatus.CANCELLED

    again = rolltap(tmp_path, "cancel", ran.id, "--db", db_url)
    assert one_line_error(again) == (
        f"Error: rollout {ran.id} is finished: it cannot become cancelled"
    )
    async with opened_store(db_url) as store:
        assert (await store.rollout(ran.id)).status == RolloutStatus.FINISHED


def test_finishing_what_is_not_there_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    assert rolltap(tmp_path, "db", "upgrade", "--db", url).returncode == 0
    missing = one_line_error(rolltap(tmp_path, "finish", "01NOSUCH", "--db", url))
    assert "01NOSUCH" in missing
    assert missing.startswith("Error: ")
    bad = rolltap(tmp_path, "finish", "01NOSUCH", "--reward", "nan", "--db", url)
    assert bad.returncode == 2
    assert "must be a finite number" in bad.stderr
    assert "Traceback" not in bad.stderr
