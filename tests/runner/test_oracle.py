"""`--harness oracle`: each task's reference solution runs as the agent, through the real
pipeline and sandboxes, and a task whose verifier does not reward its own solution is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rolltap import __version__
from rolltap.audit.integrity import verify_rollout
from rolltap.cli.main import cli
from rolltap.runner import run_batch
from rolltap.runner.harnesses import adapter
from rolltap.runner.harnesses.oracle import failed_oracle
from rolltap.runner.provenance import tree_hash
from rolltap.runner.tasks import load_tasks
from rolltap.store import RolloutStatus, Store
from tests.support.sandboxes import provider_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
FIXTURES = Path(__file__).resolve().parent / "oracle_tasks"


@pytest.mark.parametrize("kind", ["local", "bwrap"])
async def test_every_example_task_passes_its_oracle(
    kind: str, store: Store, tmp_path: Path
) -> None:
    async with provider_of(kind, tmp_path / "boxes") as provider:
        result = await run_batch(
            EXAMPLES,
            harness="oracle",
            sandbox=provider,
            concurrency=4,
            store=store,
            logs_root=tmp_path / "logs",
        )

    assert len(result.results) == len(load_tasks(EXAMPLES)) == 16
    assert failed_oracle(result.summary) == []
    assert {r.status for r in result.results} == {RolloutStatus.SUCCEEDED}
    # jsonl-partial-credit's own test scores 0.5 only for half the files: its solution makes both.
    assert {r.reward for r in result.results} == {1.0}
    # No model was started and none was called: every rollout's chain is empty and sealed.
    for r in result.results:
        view = await store.rollout(r.rollout_id)
        assert view.n_calls == 0
        assert (await verify_rollout(store, r.rollout_id)).head_seq == 0


async def test_a_broken_task_is_caught_by_its_oracle(store: Store, tmp_path: Path) -> None:
    async with provider_of("bwrap", tmp_path / "boxes") as provider:
        result = await run_batch(
            FIXTURES,
            harness="oracle",
            sandbox=provider,
            store=store,
            logs_root=tmp_path / "logs",
        )

    failed = {t.task_id: t for t in failed_oracle(result.summary)}
    by_task = {r.task_id: r for r in result.results}
    assert sorted(failed) == ["jsonl-no-solution", "jsonl-wrong-solution", "off-by-one"]
    # The verifier ran and said 0: the solution itself exited 0.
    assert (by_task["off-by-one"].status, by_task["off-by-one"].reward) == (
        RolloutStatus.SUCCEEDED,
        0.0,
    )
    assert by_task["jsonl-no-solution"].status is RolloutStatus.FAILED
    assert "has no reference solution" in (by_task["jsonl-no-solution"].error or "")
    # The helper script beside solve.sh and the [solution] env reached the sandbox.
    assert by_task["fixed-greeting"].reward == 1.0
    oracle_log = by_task["fixed-greeting"].logs_dir / "harness-stdout.txt"
    assert oracle_log.is_file()


async def test_each_rollout_records_what_it_ran_with(store: Store, tmp_path: Path) -> None:
    async with provider_of("local", tmp_path / "boxes") as provider:
        result = await run_batch(
            FIXTURES,
            harness="oracle",
            sandbox=provider,
            store=store,
            timeout=45,
            logs_root=tmp_path / "logs",
        )

    runs = {r.task_id: (await store.rollout(r.rollout_id)).meta["run"] for r in result.results}
    greeting = runs["fixed-greeting"]
    assert greeting == {
        "harness": "oracle",
        "harness_version": __version__,
        "adapter": {
            "dialect": "chat",
            "installed_from": "builtin",
            "requirements": [],
            "model": "none",
            "max_steps": None,
            "timeout": 45,
        },
        "task_hash": "sha256:" + tree_hash(FIXTURES / "fixed-greeting"),
        "task_path": str(FIXTURES / "fixed-greeting"),
        "sandbox": "local",
        "image": None,
    }
    jsonl = runs["jsonl-passes"]
    assert jsonl["task_path"] == str(FIXTURES / "shorthand.jsonl")
    assert jsonl["task_hash"].startswith("sha256:")
    assert jsonl["task_hash"] != runs["jsonl-wrong-solution"]["task_hash"]


def test_the_task_hash_follows_content_and_modes(tmp_path: Path) -> None:
    task = tmp_path / "t"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text("exit 0\n")
    first = tree_hash(task)
    (task / "tests" / "test.sh").chmod(0o755)
    executable = tree_hash(task)
    (task / "tests" / "test.sh").write_text("exit 1\n")
    changed = tree_hash(task)
    (task / "empty").mkdir()

    assert len({first, executable, changed}) == 3
    assert tree_hash(task) == changed  # an empty directory holds no content


def test_the_oracle_is_a_built_in_harness(tmp_path: Path) -> None:
    runner = CliRunner()

    installing = runner.invoke(cli, ["harness", "install", "oracle"])

    assert adapter("oracle").name == "oracle"
    assert installing.exit_code == 1
    assert "oracle is part of rolltap: there is nothing to install" in installing.output


def test_rolltap_run_with_the_oracle_exits_1_and_names_the_broken_tasks(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.sqlite'}"
    args = ["run", "--harness", "oracle", "--sandbox", "local", "--db", db]

    broken = CliRunner().invoke(cli, [*args, str(FIXTURES)])
    fine = CliRunner().invoke(cli, [*args, str(FIXTURES / "fixed-greeting")])

    assert broken.exit_code == 1, broken.output
    assert "3 of 5 tasks failed their oracle" in broken.output
    for task_id in ("off-by-one", "jsonl-wrong-solution", "jsonl-no-solution"):
        assert task_id in broken.output.split("failed their oracle", 1)[1]
    assert fine.exit_code == 0, fine.output
    assert "every task passed its oracle (1 task)" in fine.output
