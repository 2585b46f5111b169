"""`rolltap serve --config FILE`: a TOML file of serve's flags (dashes or underscores), read as
click's default_map so every flag is covered; flags on the command line override it; a key that
is no flag, or a value a flag refuses, is one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import click
import pytest
from click.core import ParameterSource

from rolltap.cli.serve import serve
from tests.cli.test_mistakes import one_line_error
from tests.support.cli import rolltap
from tests.support.processes import free_port, reaped, start_serve
from tests.support.proxy import fake_engine


def _value(option: click.Option, tmp_path: Path) -> object:
    """A value other than the default that the flag accepts."""
    kind = option.type
    if option.is_flag:
        return True
    if isinstance(kind, click.Choice):
        value: object = list(kind.choices)[-1]
    elif isinstance(kind, click.Path):
        value = str(tmp_path if not kind.file_okay else tmp_path / "file.txt")
    elif isinstance(kind, click.types.IntParamType):
        value = 3
    elif isinstance(kind, click.types.FloatParamType):
        value = 2.5
    else:
        value = f"{option.name}-from-file"
    return [value] if option.multiple else value


def test_every_flag_of_serve_can_come_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in [v for v in os.environ if v.startswith("ROLLTAP_")]:
        monkeypatch.delenv(var)
    (tmp_path / "file.txt").write_text("x")
    options = [p for p in serve.params if isinstance(p, click.Option) and p.name != "config"]
    expected = {}
    lines = []
    for i, option in enumerate(options):
        flag = next(o for o in option.opts if o.startswith("--"))[2:]
        key = flag.replace("-", "_") if i % 2 else flag  # dashes or underscores
        value = _value(option, tmp_path)
        lines.append(f"{key} = {json.dumps(value)}")
        expected[option.name] = value
    config = tmp_path / "serve.toml"
    config.write_text("\n".join(lines) + "\n")

    ctx = serve.make_context("serve", ["--config", str(config), "--port", "9999"])

    for name, value in expected.items():
        got = ctx.params[name]
        if name == "port":
            assert (got, ctx.get_parameter_source(name)) == (9999, ParameterSource.COMMANDLINE)
            continue
        shown = [str(v) for v in got] if isinstance(got, tuple) else got
        shown = str(shown) if isinstance(got, Path) else shown
        assert shown == value, name
        assert ctx.get_parameter_source(name) is ParameterSource.DEFAULT_MAP, name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "prot = 8100\n",
            "unknown key 'prot'; did you mean 'port'? the keys are the flags of "
            "`rolltap serve --help`",
        ),
        ("port = 'abc'\n", "port = 'abc': 'abc' is not a valid integer."),
        ("[runner]\nconcurrency = 4\n", "runner is a table, not a flag's value"),
        ("port = [\n", "Invalid value (at end of document)"),
    ],
)
def test_a_bad_file_is_one_line(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "serve.toml").write_text(text)
    result = rolltap(tmp_path, "serve", "--config", "serve.toml")
    assert one_line_error(result) == f"Error: --config serve.toml: {expected}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serve.toml"]


async def test_serve_runs_from_the_file_and_flags_override_it(tmp_path: Path) -> None:
    port = free_port()
    async with fake_engine() as engine:
        config = tmp_path / "serve.toml"
        config.write_text(
            f'backend = ["{engine.url}"]\nport = {free_port()}\nopen = true\n'
            'max_tokens_cap = 7\nmodel-alias = ["*=fake-model"]\n'
        )
        db = f"sqlite:///{tmp_path / 'store.sqlite'}"
        with reaped(start_serve(tmp_path, port, db, options=["--config", str(config)])) as (child,):
            await child.ready("/health")  # on --port, not the file's port
            body = {"model": "any", "messages": [{"role": "user", "content": "hi"}]}
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{child.url}/r/rk-made-up/v1/chat/completions", json=body) as resp,
            ):
                assert resp.status == 200, await resp.text()  # open = true
        _, _, sent = engine.fake.requests[-1]
        assert sent["max_tokens"] == 7  # max_tokens_cap from the file
