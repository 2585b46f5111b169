"""Entry point: `rolltap <command>`; each command group lives in its own module.

Commands are imported when they run, not to print `--help` or to start `ls`: importing all of
them (aiohttp, the proxy, the runner, docker, pyarrow) took longer than most commands take
(`python bench/cli_bench.py` prints the start-up times).
"""

from __future__ import annotations

import importlib
import sys

import click

from rolltap import __version__

_COMMANDS = {
    "db": ("rolltap.cli.db", "db", "Manage the store's database schema."),
    "egress": ("rolltap.cli.egress", "egress", "Controlled egress for sandboxes."),
    "ls": ("rolltap.cli.inspect", "ls", "List rollouts (--batches: batches), newest first."),
    "show": ("rolltap.cli.inspect", "show", "Show one rollout: its calls, segments and outcome."),
    "model": ("rolltap.cli.model", "model", "The built-in model backend."),
    "harness": ("rolltap.cli.harness", "harness", "Agent harnesses rolltap can run unmodified."),
    "serve": ("rolltap.cli.serve", "serve", "Serve the proxy that records every call."),
    "export": ("rolltap.cli.export", "export", "Write trajectories for a trainer (or ATIF)."),
    "run": ("rolltap.cli.run", "run", "Run every task in TASKS N times."),
    "finish": ("rolltap.cli.ending", "finish", "End a rollout as finished, with its reward."),
    "cancel": ("rolltap.cli.ending", "cancel", "End a rollout as cancelled."),
    "demo": ("rolltap.cli.run", "demo", "The embedded default end to end on a few tasks."),
    "audit": ("rolltap.cli.audit", "audit", "Check the store's records and signed exports."),
    "ui": ("rolltap.cli.ui", "ui", "Browse batches and rollouts in a browser (read-only)."),
    "replay": ("rolltap.cli.replay", "replay", "Run a rollout again against its own record."),
}
"""name -> (module, attribute, the one-line help `rolltap --help` shows without importing)."""

# Errors that are the user's to fix (a URL, a server, an install, a task file): one line each.
# Only a class whose module was imported can have been raised, so none is imported to check.
_USER_ERRORS = (
    ("rolltap.store.errors", "StoreError"),
    ("rolltap.engine.errors", "EngineStartError"),
    ("rolltap.engine.errors", "ModelLoadError"),
    ("rolltap.runner.harnesses.errors", "HarnessError"),
    ("rolltap.runner.sandboxes.errors", "SandboxUnavailable"),
    ("rolltap.runner.tasks", "TaskFormatError"),
    ("rolltap.runner.settings", "BatchSettingsChanged"),
    ("rolltap.runner.lease", "BatchBusy"),
    ("rolltap.runner.lease", "LeaseLost"),
    ("rolltap.runner.egress.errors", "EgressError"),
    ("rolltap.runner.host", "BackendUnreachable"),
)


def _is_user_error(error: Exception) -> bool:
    for module, name in _USER_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(error, getattr(loaded, name)):
            return True
    return False


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module, attribute, _ = _COMMANDS[cmd_name]
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, _, short) in _COMMANDS.items()])

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except Exception as e:
            if _is_user_error(e):
                raise click.ClickException(str(e)) from e
            raise


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rolltap")
def cli() -> None:
    """rolltap: token-faithful RL rollouts from unmodified agent harnesses."""


def main() -> None:
    cli(prog_name="rolltap")


if __name__ == "__main__":
    main()
