"""Entry point: `rolltap <command>`; each command group lives in its own module."""

from __future__ import annotations

import click

from rolltap import __version__
from rolltap.cli.audit import audit
from rolltap.cli.db import db
from rolltap.cli.egress import egress
from rolltap.cli.export import export
from rolltap.cli.harness import harness
from rolltap.cli.inspect import ls, show
from rolltap.cli.model import model
from rolltap.cli.replay import replay
from rolltap.cli.run import demo, run
from rolltap.cli.serve import serve
from rolltap.cli.ui import ui
from rolltap.engine.errors import EngineStartError
from rolltap.runner.egress.errors import EgressError
from rolltap.runner.harnesses.errors import HarnessError
from rolltap.runner.sandboxes.errors import SandboxUnavailable
from rolltap.runner.settings import BatchSettingsChanged
from rolltap.runner.tasks import TaskFormatError
from rolltap.store.errors import StoreError

# Errors that are the user's to fix (a URL, a server, an install, a task file): one line each.
_USER_ERRORS = (
    StoreError,
    EngineStartError,
    HarnessError,
    SandboxUnavailable,
    TaskFormatError,
    EgressError,
    BatchSettingsChanged,
)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except _USER_ERRORS as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rolltap")
def cli() -> None:
    """rolltap: token-faithful RL rollouts from unmodified agent harnesses."""


cli.add_command(db)
cli.add_command(egress)
cli.add_command(ls)
cli.add_command(show)
cli.add_command(model)
cli.add_command(harness)
cli.add_command(serve)
cli.add_command(export)
cli.add_command(run)
cli.add_command(demo)
cli.add_command(audit)
cli.add_command(ui)
cli.add_command(replay)


def main() -> None:
    cli(prog_name="rolltap")


if __name__ == "__main__":
    main()
