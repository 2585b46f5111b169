"""A user's mistakes, made through the `rolltap` command as a user would (a subprocess, real
files, real PostgreSQL): each is one line on stderr and a non-zero exit status, never a
traceback, and nothing is created by the mistake or by a read-only command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import psutil
import pytest

from tests.support.cli import ROLLTAP, rolltap
from tests.support.databases import PostgresServer

SUPPORTED = "sqlite:///PATH, sqlite+aiosqlite:///PATH, postgresql+asyncpg://USER@HOST/DB"
NO_STORE = "(`rolltap run`, `serve`, `demo` or `db upgrade` creates one)"


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["ls", "--db", "foo://bar"],
            f"Error: unsupported database 'foo' in foo://bar; expected one of {SUPPORTED}",
        ),
        (
            ["serve", "--db", "notaurl"],
            f"Error: 'notaurl' is not a database URL; expected one of {SUPPORTED} "
            "(or a path ending in .sqlite, .sqlite3, .db)",
        ),
        (
            ["serve", "--backend", "notaurl"],
            "Error: --backend notaurl: backend 'notaurl' is not an http(s) URL",
        ),
        (
            ["run", "tasks.jsonl", "--backend", "foo=http://x"],
            "Error: --backend foo=http://x: unknown backend kind 'foo'; "
            "use one of vllm, sglang, openai",
        ),
        (
            ["run", "tasks.jsonl", "--proxy-socket", "tasks.jsonl"],
            "Error: --proxy-socket needs --model: the model name that proxy serves",
        ),
        (
            ["run", "tasks.jsonl", "--task", "nope"],
            "Error: --task nope: not in tasks.jsonl (it holds quick)",
        ),
        (["ls"], f"Error: no rolltap store at {{data}}/rolltap/rolltap.sqlite {NO_STORE}"),
        (
            ["show", "01ABC", "--db", "sqlite:///missing/x.sqlite"],
            f"Error: no rolltap store at {{cwd}}/missing/x.sqlite {NO_STORE}",
        ),
        (
            ["serve", "--db", "sqlite:///missing/x.sqlite", "--backend", "http://127.0.0.1:9"],
            "Error: cannot create the store {cwd}/missing/x.sqlite: {cwd}/missing is not a "
            "directory",
        ),
    ],
)
def test_a_mistake_is_one_line_and_creates_nothing(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    (tmp_path / "tasks.jsonl").write_text(
        json.dumps({"id": "quick", "instruction": "-", "test": "true", "solution": "true"}) + "\n"
    )
    if args[0] == "serve":
        args = [*args, "--port", str(_free_port())]
    before = tree(tmp_path)
    line = one_line_error(rolltap(tmp_path, *args))
    assert line == expected.format(cwd=tmp_path, data=tmp_path / "data")
    assert tree(tmp_path) == before


def test_serve_on_a_port_in_use_says_so_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = rolltap(tmp_path, "serve", "--port", str(port), "--db", "x.sqlite")
    assert one_line_error(result) == (
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(choose another with --port)"
    )
    assert tree(tmp_path) == []


def test_export_mistakes_and_empty_selections(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.sqlite'}"
    assert rolltap(tmp_path, "db", "upgrade", "--db", db).returncode == 0
    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    before = tree(tmp_path)
    cases = {
        ("--out", "notes.txt/x.parquet"): (
            f"Error: --out notes.txt/x.parquet: {tmp_path / 'notes.txt'} is not a directory"
        ),
        ("--out", "notes.txt/a/b/x.parquet"): (
            f"Error: --out notes.txt/a/b/x.parquet: {tmp_path / 'notes.txt'} is not a directory"
        ),
        # Missing folders are made only by an export that writes: this one makes none.
        ("--out", "a/b/x.parquet"): "Error: no rollouts match (the store holds none)",
        ("--out", "x.csv"): (
            "Error: --out x.csv: rolltap writes .parquet, .jsonl, .json (or an ATIF "
            "directory); give one of those suffixes or --format"
        ),
        ("--out", "x.jsonl", "--format", "parquet"): (
            "Error: --out x.jsonl does not end in .parquet (--format parquet)"
        ),
        ("--batch", "nothing"): "Error: no rollouts match --batch nothing",
    }
    for args, expected in cases.items():
        assert one_line_error(rolltap(tmp_path, "export", "--db", db, *args)) == expected
    assert tree(tmp_path) == before

    listed = rolltap(tmp_path, "ls", "--db", db, "--batch", "nothing", "--json")
    assert (listed.returncode, listed.stdout, listed.stderr) == (
        0,
        "",
        "no rollouts match --batch nothing\n",
    )


@pytest.mark.postgres
def test_read_only_commands_never_create_tables_on_an_empty_server(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    name = f"rolltap_empty_{uuid.uuid4().hex[:8]}"
    asyncio.run(postgres._execute(f'CREATE DATABASE "{name}"'))
    try:
        url = postgres.url(name)
        expected = f"Error: {url} holds no rolltap store (`rolltap db upgrade` creates one)"
        for args in (
            ["ls"],
            ["show", "01ABC"],
            ["export", "--batch", "b"],
            ["audit", "verify", "x"],
        ):
            assert one_line_error(rolltap(tmp_path, *args, "--db", url)) == expected
        current = rolltap(tmp_path, "db", "current", "--db", url)
        assert (current.returncode, current.stdout) == (0, "- (empty)\n")
        assert asyncio.run(_tables(postgres, name)) == []
    finally:
        postgres.drop(name)


async def _tables(postgres: PostgresServer, name: str) -> list[str]:
    conn = await asyncpg.connect(postgres.admin_dsn.rsplit("/", 1)[0] + "/" + name)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    return [r["tablename"] for r in rows]


def _oracle_tasks(path: Path, solution: str) -> None:
    entry = {"id": "t", "instruction": "-", "test": "true", "solution": solution}
    path.write_text(json.dumps(entry) + "\n")


def test_a_batch_resumed_with_other_settings_is_refused(tmp_path: Path) -> None:
    _oracle_tasks(tmp_path / "tasks.jsonl", "true")
    db = f"sqlite:///{tmp_path / 's.sqlite'}"
    common = ["run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "local", "--db", db]
    first = rolltap(tmp_path, *common, "--batch", "b1")
    assert first.returncode == 0, first.stderr
    again = rolltap(tmp_path, *common, "--batch", "b1", "--max-calls", "5", "--timeout", "30")
    assert one_line_error(again) == (
        "Error: batch b1 ran with other settings (--max-calls 100 -> 5; --timeout unset -> 30.0):"
        " rerun with its settings to resume it, or name a new batch with --batch"
    )
    resumed = rolltap(tmp_path, *common, "--batch", "b1")
    assert resumed.returncode == 0, resumed.stderr
    assert "all 1 rollouts already finished; nothing to run" in resumed.stdout
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM rollout").fetchone() == (1,)


# Ctrl-C reaches a program in the foreground, whose SIGINT is not ignored. A test suite run in
# the background (`pytest &`, as a CI script may be) hands its children SIGINT ignored, which
# Python keeps: the run would rightly never see the signal. The child execs rolltap with
# SIGINT back at its default, as a terminal's foreground job has it.
FOREGROUND = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def test_ctrl_c_during_run_stops_it_cleanly(tmp_path: Path) -> None:
    _oracle_tasks(tmp_path / "tasks.jsonl", "sleep 120")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    args = [ROLLTAP, "run", "tasks.jsonl", "--harness", "oracle", "--sandbox", "local"]
    run = subprocess.Popen(
        [sys.executable, "-c", FOREGROUND, *args, "--db", "s.sqlite"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Ctrl-C once the harness really runs (a rollout marked running may still be spawning it).
        sleeper = _descendant(run.pid, "sleep", timeout=60)
        assert _statuses(tmp_path / "s.sqlite") == ["running"]
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert not sleeper.is_running() or sleeper.status() == psutil.STATUS_ZOMBIE
    assert run.returncode == 130
    assert stderr.strip().splitlines() == [
        "Error: interrupted; run the same command again to resume the batch"
    ]
    assert _statuses(tmp_path / "s.sqlite") == ["cancelled"]


def _descendant(pid: int, name: str, timeout: float) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.name() == name:
                    return child
        time.sleep(0.1)
    raise AssertionError(f"no {name} process under {pid}")


def _statuses(path: Path) -> list[str]:
    if not path.exists():
        return []
    try:
        with sqlite3.connect(path) as conn:
            return [r[0] for r in conn.execute("SELECT status FROM rollout")]
    except sqlite3.OperationalError:
        return []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
