"""`rolltap show` says why a rollout got its reward without misleading its reader: a harness
log's last lines with the host's paths and mini-swe-agent's submit step said as what it is."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store import NewRollout
from rolltap.store.events import HarnessEnded, Started
from tests.support.cli import rolltap
from tests.support.stores import opened_store

# The last lines mini-swe-agent 2.4.6 prints (its console, --yolo --exit-immediately) when the
# agent submits: the submit step's observation as an action that was not executed, its exit
# message, where it saved the trajectory. The path is composed at run time: the local sandbox
# rewrites /logs in the command it runs, not in what the command prints.
MINI_SUBMITS = r"""p=/lo
printf '\nmini-swe-agent (step 2, $0.00):\nDone.\n\n```\n'
printf 'echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```\n'
printf '\nTool:\n<returncode>\n-1\n<output>\n\n<exception_info>\naction was not executed\n'
printf '\nExit:\n\n'
echo "Saved trajectory to '${p}gs/agent/mini-swe-agent.traj.json'"
mkdir -p /logs/agent
echo '{"info": {"exit_status": "Submitted"}}' > /logs/agent/mini-swe-agent.traj.json
"""


def _run_one(tmp_path: Path, task: dict[str, str]) -> tuple[str, Path]:
    """One rollout of `task` through the real runner (the oracle, the local sandbox); its id
    and the host folder of its logs."""
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    ran = rolltap(
        tmp_path,
        *("run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "local", "-c", "1"),
        *("--db", "s.sqlite", "--batch", "b"),
    )
    assert "rolltap show" in ran.stdout, ran.stdout + ran.stderr
    rollout = re.search(r"rolltap show (\w+) --db s.sqlite", ran.stdout).group(1)  # type: ignore[union-attr]
    return rollout, tmp_path / "data" / "rolltap" / "runs" / "b" / rollout


def test_the_harness_log_names_the_submit_step_and_the_hosts_paths(tmp_path: Path) -> None:
    rollout, logs = _run_one(
        tmp_path, {"id": "submits", "instruction": "-", "test": "true", "solution": MINI_SUBMITS}
    )

    shown = rolltap(tmp_path, "show", rollout, "--db", "s.sqlite")

    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    log = out[out.index("harness log (last lines)") : out.index(f"  logs {logs}")]
    # The submit step is said as what it is, not as a command that failed with -1.
    assert "    Tool:\n    (the submit step: mini-swe-agent ends the episode" in log
    assert "<returncode>" not in log
    assert "\n    -1\n" not in log
    # Where the trajectory is on this machine, not in the sandbox that is gone.
    trajectory = logs / "agent" / "mini-swe-agent.traj.json"
    assert f"Saved trajectory to '{trajectory}'" in log
    assert trajectory.is_file()
    assert "/logs/agent" not in out


def test_a_tool_call_after_the_submit_step_and_the_verifiers_paths(tmp_path: Path) -> None:
    """An answer that submits and then calls again: mini-swe-agent runs neither; the second is
    said as a call after the submit step, in either form of the observation. The verifier's
    paths are the host's too."""
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    printed = ["<returncode>", "-1", "<output>", "<exception_info>", "action was not executed"]
    # The same observation as mini.yaml's template writes it, where a console shows it raw.
    raw = [
        "{",
        '  "returncode": -1,',
        '  "output": "", "exception_info": "action was not executed"',
        "}",
    ]
    tail = "\n".join(["Tool:", *printed, "Tool:", *raw, "Exit:"])

    async def make() -> str:
        async with opened_store(url) as store:
            rollout = (await store.create_rollout(NewRollout(task_id="t"))).id
            await store.report(rollout, Started())
            meta = {
                "logs_dir": "/srv/runs/r1",
                "harness_tail": tail,
                "verifier_tail": "wrote /logs/verifier/reward.txt (not /logs/verifierx)",
            }
            await store.report(rollout, HarnessEnded(1.0, {"ending": "finished"}, meta=meta))
            return rollout

    rollout = asyncio.run(make())
    shown = CliRunner().invoke(cli, ["show", rollout, "--db", url], terminal_width=300)

    assert shown.exit_code == 0, shown.output
    assert (
        "    Tool:\n    (the submit step: mini-swe-agent ends the episode at echo "
        "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT without running it, and logs it as returncode -1, "
        '"action was not executed")\n'
        "    Tool:\n    (a tool call after the submit step: not run, returncode -1)\n    Exit:\n"
    ) in shown.output
    assert "wrote /srv/runs/r1/verifier/reward.txt (not /logs/verifierx)" in shown.output


def test_a_failed_verdict_says_which_figure_decided_it(tmp_path: Path) -> None:
    """Tests that write reward 0 and exit 0: the verdict is the reward file's, and `show` says
    so, where it said `test_exit_code 0` beside a failed verdict and left the reader to guess."""
    rollout, _ = _run_one(
        tmp_path,
        {
            "id": "writes-zero",
            "instruction": "-",
            "test": "echo 0 > /logs/verifier/reward.txt; exit 0",
            "solution": "true",
        },
    )

    out = rolltap(tmp_path, "show", rollout, "--db", "s.sqlite").stdout

    assert (
        "  verdict failed: reward 0.0 (from reward.txt); tests exited 0 "
        "(the reward file decides, not the exit code)\n"
    ) in out
    assert "test_exit_code" not in out


def test_a_verdict_from_the_exit_code_says_so(tmp_path: Path) -> None:
    rollout, _ = _run_one(
        tmp_path, {"id": "exits-1", "instruction": "-", "test": "exit 1", "solution": "true"}
    )

    out = rolltap(tmp_path, "show", rollout, "--db", "s.sqlite").stdout

    assert (
        "  verdict failed: reward 0.0 (from the tests' exit code: they wrote no reward file); "
        "tests exited 1\n"
    ) in out
