"""Every command `rolltap --help` lists (without importing it) exists and runs its --help."""

from __future__ import annotations

import click
from click.testing import CliRunner

from rolltap.cli.main import cli


def test_each_listed_command_resolves_to_a_command_with_help() -> None:
    ctx = click.Context(cli)
    names = cli.list_commands(ctx)
    assert "egress" in names
    assert "run" in names
    for name in names:
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command), name
        shown = CliRunner().invoke(cli, [name, "--help"])
        assert shown.exit_code == 0, (name, shown.output)
