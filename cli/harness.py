"""`rolltap harness ...`: install and inspect agent harnesses, and show what rolltap's adapter
sets for one, to run it against the proxy by hand."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import click

from ..runner.harnesses import (
    HarnessError,
    Installation,
    RunContext,
    adapter,
    adapters,
    harness_root,
    install,
)
from ..runner.harnesses.base import base_env
from ..runner.harnesses.install import read_record


@click.group()
def harness() -> None:
    """Agent harnesses rolltap can run unmodified."""


@harness.command("install")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--force", is_flag=True, help="Reinstall even when an install is present.")
def install_command(names: tuple[str, ...], force: bool) -> None:
    """Install harnesses into isolated prefixes under the harness directory.

    The directory is $ROLLTAP_HARNESS_DIR, else rolltap/harnesses in your user data directory.
    """
    root = harness_root()
    try:
        chosen = [adapter(n) for n in names]
        for h in chosen:
            record = install(h, root, force=force, say=_prefixed(h.name))
            click.echo(
                f"{h.name}: installed at {record.prefix} "
                f"({record.size_bytes / 1e6:.0f} MB, {record.seconds:.1f} s)"
            )
    except HarnessError as e:
        raise click.ClickException(str(e)) from e


def _prefixed(name: str) -> Callable[[str], None]:
    return lambda message: click.echo(f"{name}: {message}")


@harness.command("list")
def list_command() -> None:
    """Show every harness, whether it is installed, and where."""
    root = harness_root()
    click.echo(f"harness directory: {root}")
    for name, h in adapters().items():
        record = read_record(name, root)
        if record is None:
            state, where = "not installed", ""
        elif not record.is_current(h):
            state, where = "outdated", record.prefix
        else:
            state, where = f"installed {record.size_bytes / 1e6:.0f} MB", record.bin_dir
        click.echo(f"{name:<16} {h.dialect:<10} {state:<18} {where}")
        if record is not None and len(record.mounts) > 1:
            click.echo(f"{'':<16} also mounts: {' '.join(record.mounts[1:])}")


@harness.command("env")
@click.argument("name", type=click.Choice(list(adapters())), metavar="NAME")
@click.option(
    "--rollout",
    "key",
    required=True,
    metavar="KEY",
    help="The rollout's key (`key` of POST /admin/rollouts), or a $VARIABLE holding it.",
)
@click.option(
    "--proxy",
    default="http://127.0.0.1:8100",
    show_default=True,
    envvar="ROLLTAP_PROXY",
    help="The proxy's URL, as the harness reaches it.",
)
@click.option(
    "--model",
    default="default",
    show_default=True,
    help="The model name the harness asks for (a proxy serving one model answers any name).",
)
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also write the files the adapter writes for the harness (its config) under this "
    "directory, and point the harness's HOME there.",
)
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=None,
    help="The harness's own step limit, where it has one, as `rolltap run --max-steps` sets "
    "it (in the command printed last: mini-swe-agent's step_limit, Claude Code's --max-turns).",
)
def env_command(
    name: str, key: str, proxy: str, model: str, home: Path | None, max_steps: int | None
) -> None:
    """Print, as `export K=V` lines, the environment rolltap's adapter gives NAME for the rollout
    with this KEY (runner/harnesses/NAME.py): `eval "$(rolltap harness env ...)"`.

    Run the harness in a sandbox (a container, a VM, bubblewrap): it runs the model's commands
    with your rights. The key is printed as you give it: `--rollout '$KEY'` keeps it out of the
    output (the lines then read it from $KEY when evaluated).
    """
    h = adapter(name)
    record = read_record(name, harness_root())
    installed = (
        record.installation()
        if record is not None and record.is_current(h)
        else Installation(name, PurePosixPath("."), PurePosixPath(""))
    )
    here = PurePosixPath(Path.cwd())
    ctx = RunContext(
        instruction="<task>",
        rollout_url=f"{proxy.rstrip('/')}/r/{key}",
        key=key,
        model=model,
        workdir=here,
        home=PurePosixPath((home or Path.home()).absolute()),
        logs_dir=PurePosixPath("."),
        max_steps=max_steps,
    )
    launch = h.launch(ctx, installed)
    module = h.name.replace("-", "_")
    click.echo(f"# {name} on the rolltap proxy at {proxy}, set up as runner/harnesses/{module}.py")
    click.echo("# does. Run it in a sandbox: it runs the model's commands with your rights.")
    if installed.prefix == PurePosixPath("."):
        click.echo(f"# not installed by rolltap (`rolltap harness install {name}`): yours is used")
    # Your PATH and LANG stay; HOME only moves with --home.
    own = base_env(ctx, installed)
    for var, value in launch.env.items():
        if var in own and (var != "HOME" or home is None):
            continue
        click.echo(f"export {var}={_shell(value, key)}")
    for path, content in launch.files.items():
        if home is None:
            click.echo(f"# rolltap also writes {path} for it: add --home DIR to write it there")
            continue
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_expanded(content, key))
        click.echo(f"# wrote {path}")
    click.echo(f"# rolltap starts it as: {shlex.join(launch.argv)}")


_REFERENCE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def _shell(value: str, key: str) -> str:
    """`value` in double quotes for a POSIX shell, with the key as it was given: a $VARIABLE
    expands when the lines are evaluated, anything else is quoted."""
    given = key if _REFERENCE.fullmatch(key) else _escaped(key)
    parts = value.split(key) if key else [value]
    return '"' + given.join(_escaped(part) for part in parts) + '"'


def _escaped(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def _expanded(content: str, key: str) -> str:
    """A file's content with a $VARIABLE key replaced by its value: files are not evaluated."""
    if not _REFERENCE.fullmatch(key):
        return content
    variable = key.strip("${}")
    if variable not in os.environ:
        raise click.ClickException(
            f"--rollout {key}: ${variable} is not set, so --home cannot "
            "write the key into the harness's config"
        )
    return content.replace(key, os.environ[variable])
