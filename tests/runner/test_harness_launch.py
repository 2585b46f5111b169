"""Every adapter's Launch: the key stays off the command line, URLs and paths land where the
sandbox expects them. No harness needs to be installed."""

from __future__ import annotations

import json
import tomllib
from pathlib import PurePosixPath

import pytest

from rolltap.runner.harnesses import Harness, Installation, RunContext, adapters

KEY = "rk_secret_5a5a5a5a5a"
ROOT = PurePosixPath("/sandbox")
INSTALL = Installation(
    name="any",
    prefix=PurePosixPath("/opt/h"),
    bin_dir=PurePosixPath("/opt/h/bin"),
    mounts=(PurePosixPath("/opt/h"),),
    path=("/opt/node/bin",),
)
ALL = list(adapters().values())


def ctx(instruction: str = "Fix the bug.", max_steps: int | None = None) -> RunContext:
    return RunContext(
        instruction=instruction,
        rollout_url=f"http://127.0.0.1:8000/r/{KEY}",
        key=KEY,
        model="served/model-1",
        workdir=ROOT / "work",
        home=ROOT / "home",
        logs_dir=ROOT / "logs",
        max_steps=max_steps,
    )


def test_the_registry_has_the_six_harnesses() -> None:
    assert list(adapters()) == [
        "mini-swe-agent",
        "openhands",
        "qwen-code",
        "opencode",
        "codex",
        "claude-code",
    ]
    assert {h.name: h.dialect for h in ALL}["codex"] == "responses"
    assert {h.name: h.dialect for h in ALL}["claude-code"] == "messages"


@pytest.mark.parametrize("harness", ALL, ids=lambda h: h.name)
def test_the_key_is_passed_out_of_sight(harness: Harness) -> None:
    launch = harness.launch(ctx(), INSTALL)

    assert not [a for a in launch.argv if KEY in a]
    assert KEY in launch.env.values()
    assert KEY not in repr(launch)
    assert KEY not in repr(ctx())


@pytest.mark.parametrize("harness", ALL, ids=lambda h: h.name)
def test_paths_stay_inside_the_sandbox_layout(harness: Harness) -> None:
    launch = harness.launch(ctx(), INSTALL)

    assert launch.argv[0].startswith("/opt/h/bin/")
    assert launch.cwd == ROOT / "work"
    assert launch.env["HOME"] == str(ROOT / "home")
    search = launch.env["PATH"].split(":")
    assert search[0] == "/opt/node/bin"
    assert "/opt/h/bin" not in search, "the harness's venv must not shadow the task's python"
    assert launch.stdout_path is not None
    assert launch.stdout_path.parent == ROOT / "logs"
    assert launch.logs
    for path in [*launch.logs, *launch.files]:
        assert path.is_relative_to(ROOT / "logs") or path.is_relative_to(ROOT / "home"), path


@pytest.mark.parametrize("harness", ALL, ids=lambda h: h.name)
def test_the_proxy_url_has_the_dialects_shape(harness: Harness) -> None:
    launch = harness.launch(ctx(), INSTALL)
    where = " ".join([*launch.env.values(), *launch.files.values()])

    if harness.dialect == "messages":
        assert launch.env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:8000/r/{KEY}"
    else:
        assert f"http://127.0.0.1:8000/r/{KEY}/v1" in where


@pytest.mark.parametrize("harness", ALL, ids=lambda h: h.name)
def test_an_instruction_that_looks_like_a_flag_stays_one_argument(harness: Harness) -> None:
    instruction = "--help me\nwith 'quotes' and $HOME"
    argv = harness.launch(ctx(instruction), INSTALL).argv

    assert argv.count(instruction) + argv.count(f"--prompt={instruction}") == 1
    held = argv.index(instruction) if instruction in argv else argv.index(f"--prompt={instruction}")
    before = argv[held - 1]
    assert (
        before in ("--", "-t", "--task") or before.startswith("--prompt") or held == len(argv) - 1
    )


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        ("mini-swe-agent", "agent.step_limit=7"),
        ("claude-code", "7"),
        ("qwen-code", "--max-session-turns=7"),
    ],
)
def test_step_limits_reach_the_command_line(name: str, flag: str) -> None:
    harness = adapters()[name]

    assert flag in harness.launch(ctx(max_steps=7), INSTALL).argv
    assert flag not in harness.launch(ctx(), INSTALL).argv


def test_codex_config_names_a_responses_provider_and_turns_websockets_off() -> None:
    launch = adapters()["codex"].launch(ctx(), INSTALL)
    config = tomllib.loads(launch.files[ROOT / "home" / ".codex" / "config.toml"])

    provider = config["model_providers"][config["model_provider"]]
    assert config["model"] == "served/model-1"
    assert provider["wire_api"] == "responses"
    assert provider["base_url"] == f"http://127.0.0.1:8000/r/{KEY}/v1"
    assert launch.env[provider["env_key"]] == KEY
    assert config["features"] == {
        "responses_websockets": False,
        "responses_websockets_v2": False,
        "shell_snapshot": False,
    }
    assert launch.env["CODEX_HOME"] == str(ROOT / "home" / ".codex")


def test_opencode_config_reads_the_key_from_the_environment() -> None:
    launch = adapters()["opencode"].launch(ctx(max_steps=4), INSTALL)
    ((path, text),) = launch.files.items()
    config = json.loads(text)

    assert launch.env["OPENCODE_CONFIG"] == str(path)
    options = config["provider"]["rolltap"]["options"]
    assert options["apiKey"] == "{env:ROLLTAP_API_KEY}"
    assert launch.env["ROLLTAP_API_KEY"] == KEY
    assert config["model"] == "rolltap/served/model-1"
    assert config["agent"]["build"]["steps"] == 4


def test_claude_code_side_models_are_the_served_model() -> None:
    env = adapters()["claude-code"].launch(ctx(), INSTALL).env

    for var in (
        "ANTHROPIC_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    ):
        assert env[var] == "served/model-1"
    assert env["IS_SANDBOX"] == "1"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["ANTHROPIC_AUTH_TOKEN"] == KEY


@pytest.mark.parametrize("name", ["mini-swe-agent", "openhands"])
def test_litellm_harnesses_use_hosted_vllm_and_the_offline_cost_map(name: str) -> None:
    launch = adapters()[name].launch(ctx(), INSTALL)

    assert "hosted_vllm/served/model-1" in [*launch.argv, *launch.env.values()]
    assert launch.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
