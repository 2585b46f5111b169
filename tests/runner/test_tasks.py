"""Loading tasks: Harbor task directories, directories of them, the JSONL shorthand, and the
errors a malformed task gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolltap.runner.tasks import TaskFormatError, load_tasks, strip_canary

TOML = """
schema_version = "1.1"

[metadata]
difficulty = "easy"

[agent]
timeout_sec = 120.0
user = "agent"

[verifier]
timeout_sec = 30
user = 1000
env = { OPENAI_API_KEY = "unused", MODE = "strict" }

[solution]
env = { HINT = "yes" }

[environment]
docker_image = "example/image:1"
cpus = 2
memory_mb = 4096
allow_internet = false
build_timeout_sec = 900
"""


def make_task(
    root: Path, name: str = "my-task", toml: str = TOML, files: dict[str, str | None] | None = None
) -> Path:
    """A task directory; `files` adds or replaces files by relative path (None removes one)."""
    d = root / name
    contents: dict[str, str | None] = {
        "task.toml": toml,
        "instruction.md": "Do the thing.\n",
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "#!/bin/bash\ntrue\n",
        **(files or {}),
    }
    for rel, text in contents.items():
        if text is not None:
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
    return d


def write_jsonl(path: Path, *objects: object) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))
    return path


def test_a_harbor_task_directory_loads_every_setting(tmp_path: Path) -> None:
    d = make_task(tmp_path)
    [task] = load_tasks(d)

    assert task.id == "my-task"
    assert task.instruction == "Do the thing.\n"
    assert task.source == d.resolve()
    assert task.workdir == "/app"
    assert task.agent_timeout_sec == 120.0
    assert task.agent_user == "agent"
    assert task.verifier_timeout_sec == 30.0
    assert task.verifier_user == "1000"
    assert task.verifier_env == {"OPENAI_API_KEY": "unused", "MODE": "strict"}
    assert task.solution_env == {"HINT": "yes"}
    assert task.tests_dir == d.resolve() / "tests"
    assert task.solution_dir == d.resolve() / "solution"
    assert task.test_script is None
    assert not task.reward_from_exit_code
    assert task.metadata == {"difficulty": "easy"}
    env = task.environment
    assert (env.docker_image, env.cpus, env.memory_mb) == ("example/image:1", 2.0, 4096)
    assert (env.allow_internet, env.build_timeout_sec) == (False, 900.0)
    assert env.has_image
    assert env.dockerfile_dir is None


def test_defaults_follow_harbor(tmp_path: Path) -> None:
    [task] = load_tasks(make_task(tmp_path, toml=""))

    assert task.agent_timeout_sec == 600.0
    assert task.verifier_timeout_sec == 600.0
    assert task.environment.allow_internet is True
    assert not task.environment.has_image
    assert task.workdir == "/app"


@pytest.mark.parametrize(("written", "mb"), [('"2G"', 2048), ('"512M"', 512), ('"1.5g"', 1536)])
def test_harbors_older_memory_field_is_read_as_memory_mb(
    tmp_path: Path, written: str, mb: int
) -> None:
    (task,) = load_tasks(make_task(tmp_path, toml=f"[environment]\nmemory = {written}\n"))

    assert task.environment.memory_mb == mb


def test_environment_files_setup_and_dockerfile_workdir(tmp_path: Path) -> None:
    d = make_task(
        tmp_path,
        toml="",
        files={
            "environment/Dockerfile": "FROM x\nWORKDIR /srv\nRUN true\nWORKDIR /testbed\n",
            "environment/files/data/a.txt": "a",
            "environment/setup.sh": "touch ready\n",
        },
    )
    [task] = load_tasks(d)

    assert task.workdir == "/testbed"
    assert task.environment.dockerfile_dir == d.resolve() / "environment"
    assert task.environment.files_dir == d.resolve() / "environment" / "files"
    assert task.environment.setup_script == "touch ready\n"


def test_workdir_in_task_toml_wins_over_the_dockerfile(tmp_path: Path) -> None:
    d = make_task(
        tmp_path,
        toml='[environment]\nworkdir = "/work/space/"\n',
        files={"environment/Dockerfile": "FROM x\nWORKDIR /srv\n"},
    )

    assert load_tasks(d)[0].workdir == "/work/space"


def test_canary_lines_are_stripped_from_the_instruction(tmp_path: Path) -> None:
    text = "<!-- BENCHMARK DATA canary GUID 1234 -->\n# canary: do not train\n\nReal task.\n"
    d = make_task(tmp_path, files={"instruction.md": text})

    assert load_tasks(d)[0].instruction == "Real task.\n"
    assert strip_canary("no canary here") == "no canary here"


def test_a_directory_of_tasks_and_jsonl_files_loads_them_all(tmp_path: Path) -> None:
    make_task(tmp_path, "b-task")
    make_task(tmp_path, "a-task")
    (tmp_path / "notes").mkdir()
    write_jsonl(tmp_path / "quick.jsonl", {"id": "q1", "instruction": "x", "test": "true"})

    assert [t.id for t in load_tasks(tmp_path)] == ["a-task", "b-task", "q1"]


def test_the_jsonl_shorthand(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "set.jsonl",
        {"id": "one", "instruction": "Make it.", "setup": "echo x > f", "test": "test -f g"},
        {
            "id": "two",
            "instruction": "Other.",
            "test": "true",
            "solution": "touch g",
            "workdir": "/work",
            "docker_image": "img:1",
            "agent_timeout_sec": 60,
            "verifier_timeout_sec": 5,
        },
    )
    one, two = load_tasks(path)

    assert (one.id, one.instruction, one.workdir) == ("one", "Make it.", "/app")
    assert one.environment.setup_script == "echo x > f"
    assert one.test_script == "test -f g"
    assert one.reward_from_exit_code
    assert one.tests_dir is None
    assert one.solution_script is None
    assert one.source == path.resolve()
    assert (two.workdir, two.environment.docker_image, two.solution_script) == (
        "/work",
        "img:1",
        "touch g",
    )
    assert (two.agent_timeout_sec, two.verifier_timeout_sec) == (60.0, 5.0)


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ({"instruction.md": None}, "missing instruction.md"),
        ({"instruction.md": "  \n"}, "empty instruction"),
        ({"tests/test.sh": None}, "missing tests/test.sh"),
        ({"task.toml": "[agent\n"}, "not valid TOML"),
        ({"task.toml": "agent = 3\n"}, "[agent] must be a table"),
        ({"task.toml": "[agent]\ntimeout_sec = -1\n"}, "timeout_sec"),
        ({"task.toml": '[agent]\ntimeout_sec = "long"\n'}, "timeout_sec"),
        ({"task.toml": "[verifier]\nenv = { A = 1 }\n"}, "table of strings"),
        ({"task.toml": '[environment]\nworkdir = "app"\n'}, "absolute path"),
        ({"task.toml": '[environment]\nworkdir = "/a/../etc"\n'}, "absolute path"),
        ({"task.toml": "[environment]\nmemory_mb = 0.5\n"}, "memory_mb"),
        ({"task.toml": "[environment]\ncpus = 0\n"}, "cpus"),
        ({"task.toml": '[environment]\nmemory = "lots"\n'}, "expected a size"),
        ({"task.toml": '[environment]\nmemory = "2G"\nmemory_mb = 1024\n'}, "differ"),
        ({"task.toml": '[environment]\nallow_internet = "no"\n'}, "allow_internet"),
        ({"task.toml": "[agent]\nuser = true\n"}, "user"),
        ({"task.toml": '[[steps]]\nname = "a"\n'}, "multi-step"),
    ],
)
def test_a_malformed_task_directory_names_the_file_and_the_problem(
    tmp_path: Path, files: dict[str, str | None], problem: str
) -> None:
    base = make_task(tmp_path)
    for rel, text in files.items():
        if text is None:
            (base / rel).unlink()
        else:
            (base / rel).write_text(text)

    with pytest.raises(TaskFormatError, match=problem.replace("[", r"\[")) as caught:
        load_tasks(base)
    assert str(base.resolve()) in str(caught.value)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"instruction": "x", "test": "true"}', "`id`"),
        ('{"id": "a b", "instruction": "x", "test": "true"}', "`id`"),
        ('{"id": "a", "test": "true"}', "`instruction`"),
        ('{"id": "a", "instruction": "x"}', "`test`"),
        ('{"id": "a", "instruction": "x", "test": "true", "tset": 1}', "unknown key"),
        ('{"id": "a", "instruction": "x", "test": "true", "setup": 3}', "`setup`"),
        ('{"id": "a", "instruction": "x", "test": "true", "agent_timeout_sec": 0}', "agent_t"),
    ],
)
def test_a_malformed_jsonl_line_names_the_file_the_line_and_the_problem(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text('{"id": "ok", "instruction": "x", "test": "true"}\n\n' + line + "\n")

    with pytest.raises(TaskFormatError, match=problem) as caught:
        load_tasks(path)
    assert f"{path.resolve()}:3:" in str(caught.value)


def test_duplicate_ids_are_an_error(tmp_path: Path) -> None:
    make_task(tmp_path, "same")
    write_jsonl(tmp_path / "more.jsonl", {"id": "same", "instruction": "x", "test": "true"})

    with pytest.raises(TaskFormatError, match="'same' appears twice"):
        load_tasks(tmp_path)


@pytest.mark.parametrize("name", ["nothing-here", "empty-dir", "tasks.txt", "bad name"])
def test_paths_that_hold_no_tasks(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name == "empty-dir":
        path.mkdir()
    elif name == "tasks.txt":
        path.write_text("{}")
    elif name == "bad name":
        make_task(tmp_path, name)

    with pytest.raises(TaskFormatError, match=str(tmp_path)):
        load_tasks(path)
