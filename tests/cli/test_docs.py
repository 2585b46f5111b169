"""The README and the pages under docs/ say only what is true of the commands they show: every
`rolltap ...` command in a shell block parses (its subcommand and every flag exist, with a value
where one is needed), and every link to a file of the repository points at one that exists."""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import click
import pytest

from rolltap.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.S)
_INLINE = re.compile(r"`(rolltap [^`\n]+)`")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_SEPARATORS = re.compile(r"&&|\|\||[|;]")


def _commands(page: Path) -> list[list[str]]:
    """The `rolltap` command lines of a page's shell blocks and inline code, as argument
    lists."""
    found = []
    for block in _BLOCK.findall(page.read_text()):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("#"):
                continue
            for part in _SEPARATORS.split(line):
                words = shlex.split(part.split(" #", 1)[0], posix=True)
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # VAR=value before the command
                if words[:1] == ["rolltap"]:
                    found.append(words[1:])
    for span in _INLINE.findall(_BLOCK.sub("", page.read_text())):
        with contextlib.suppress(ValueError):  # quoted output, not a command
            words = shlex.split(span)
            if words[1] in cli.list_commands(click.Context(cli)):
                found.append(words[1:])
    return found


def _parses(args: list[str]) -> None:
    """Resolve the subcommands and parse the flags as the command's own parser does, running
    nothing: no callbacks, no value checks that need the machine (paths may be examples)."""
    command: click.Command = cli
    context = click.Context(command, info_name="rolltap")
    rest = list(args)
    while True:
        _, rest, _ = command.make_parser(context).parse_args(rest)
        if not isinstance(command, click.Group) or not rest:
            return  # a group named alone shows its subcommands
        name, rest = rest[0], rest[1:]
        sub = command.get_command(context, name)
        assert sub is not None, f"rolltap has no command {name!r} (in `rolltap {shlex.join(args)}`)"
        command, context = sub, click.Context(sub, info_name=name, parent=context)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_parses(page: Path) -> None:
    commands = _commands(page)
    for args in commands:
        try:
            _parses(args)
        except click.UsageError as e:
            pytest.fail(f"{page.name}: `rolltap {shlex.join(args)}`: {e.format_message()}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_the_repository_exists(page: Path) -> None:
    missing = [
        target
        for target in _LINK.findall(page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert not missing, f"{page.name} links to files that are not there: {missing}"


def test_the_pages_show_commands() -> None:
    """The check above has something to check: the README and the docs show commands."""
    assert sum(len(_commands(p)) for p in PAGES) >= 40
