"""`rolltap harness env NAME --rollout KEY`: the environment rolltap's adapter gives a harness,
as `export` lines a shell evaluates, with the rollout's base URL; a client configured from them
reaches the real proxy and is recorded in that rollout."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from rolltap.runner.harnesses import Installation, RunContext, adapter, adapters
from rolltap.store import Store
from tests.support.cli import ROLLTAP
from tests.support.proxy import fake_engine, new_rollout, running_proxy

# Evaluate the lines as a user would, then show what the harness would see.
SHOW = 'eval "$("$@")" && python3 -c "import json, os; print(json.dumps(dict(os.environ)))"'


def _evaluated(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    done = subprocess.run(
        ["bash", "-c", SHOW, "show", ROLLTAP, "harness", "env", *args],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    shown: dict[str, str] = json.loads(done.stdout)
    return shown


@pytest.mark.parametrize("name", list(adapters()))
def test_the_lines_are_what_the_adapter_sets(tmp_path: Path, name: str) -> None:
    key = "rk-Ab_9-x"
    proxy = "http://127.0.0.1:8199"
    got = _evaluated(tmp_path, name, "--rollout", key, "--proxy", proxy, "--model", "m")
    ctx = RunContext(
        instruction="-",
        rollout_url=f"{proxy}/r/{key}",
        key=key,
        model="m",
        workdir=PurePosixPath(tmp_path),
        home=PurePosixPath(tmp_path),
        logs_dir=PurePosixPath("."),
    )
    expected = adapter(name).launch(ctx, Installation(name, PurePosixPath("."), PurePosixPath("")))
    for var, value in expected.env.items():
        if var in ("PATH", "HOME", "LANG"):  # the user's own stay
            continue
        assert got[var] == value, var
    assert got["PATH"] == "/usr/bin:/bin"
    assert got["HOME"] == str(tmp_path)


def test_mini_swe_agent_gets_the_settings_a_by_hand_run_missed(tmp_path: Path) -> None:
    text = subprocess.run(
        [ROLLTAP, "harness", "env", "mini-swe-agent", "--rollout", "rk-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    exports = [line for line in text.splitlines() if not line.startswith("#")]
    assert 'export MSWEA_CONFIGURED="true"' in exports
    assert 'export MSWEA_COST_TRACKING="ignore_errors"' in exports
    assert 'export LITELLM_LOCAL_MODEL_COST_MAP="True"' in exports
    assert 'export HOSTED_VLLM_API_BASE="http://127.0.0.1:8100/r/rk-1/v1"' in exports
    assert all(line.startswith("export ") for line in exports)
    assert "Run it in a sandbox" in text
    assert "--model hosted_vllm/default" in text.splitlines()[-1]


@pytest.mark.parametrize(
    ("name", "limit"),
    [("mini-swe-agent", "agent.step_limit=7"), ("claude-code", "--max-turns 7")],
)
def test_the_step_limit_reaches_the_command(name: str, limit: str) -> None:
    """Without --max-steps the printed command has no limit of rolltap's; with it, the same
    one `rolltap run --max-steps` gives the harness."""

    def last_line(*extra: str) -> str:
        done = subprocess.run(
            [ROLLTAP, "harness", "env", name, "--rollout", "rk-1", *extra],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.splitlines()[-1]

    assert limit.split("=")[0].split()[0] not in last_line()
    assert limit in last_line("--max-steps", "7")
    refused = subprocess.run(
        [ROLLTAP, "harness", "env", name, "--rollout", "rk-1", "--max-steps", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr


def test_a_variable_key_stays_out_of_the_output(tmp_path: Path) -> None:
    secret = "rk-secret-value"
    text = subprocess.run(
        [ROLLTAP, "harness", "env", "qwen-code", "--rollout", "$ROLLOUT_KEY"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ROLLOUT_KEY": secret},
    ).stdout
    assert secret not in text
    assert 'export OPENAI_API_KEY="$ROLLOUT_KEY"' in text
    got = _evaluated(
        tmp_path, "qwen-code", "--rollout", "$ROLLOUT_KEY", env={"ROLLOUT_KEY": secret}
    )
    assert got["OPENAI_API_KEY"] == secret
    assert got["OPENAI_BASE_URL"] == f"http://127.0.0.1:8100/r/{secret}/v1"


def test_home_writes_the_adapters_files(tmp_path: Path) -> None:
    home = tmp_path / "codex-home"
    got = _evaluated(tmp_path, "codex", "--rollout", "rk-2", "--home", str(home))
    assert got["HOME"] == str(home)
    assert got["CODEX_HOME"] == str(home / ".codex")
    config = (home / ".codex" / "config.toml").read_text()
    assert 'base_url = "http://127.0.0.1:8100/r/rk-2/v1"' in config


async def test_a_client_set_up_from_the_lines_is_recorded_in_the_rollout(
    store: Store, tmp_path: Path
) -> None:
    rollout_id, key = await new_rollout(store, task_id="by-hand")
    # qwen-code's variables are the openai SDK's own: the SDK stands in for the harness.
    call = (
        "import openai; c = openai.OpenAI(); "
        "r = c.chat.completions.create(model=__import__('os').environ['OPENAI_MODEL'], "
        "messages=[{'role': 'user', 'content': 'hi'}]); print(r.choices[0].message.content)"
    )
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        script = f'eval "$("$@")" && {sys.executable} -c "{call}"'
        args = [ROLLTAP, "harness", "env", "qwen-code", "--rollout", key, "--proxy", proxy.url]
        done = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-c", script, "call", *args],
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    calls = await store.calls(rollout_id)
    assert len(calls) == 1
    assert calls[0].model == "default"
