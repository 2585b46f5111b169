"""`rolltap finish` and `rolltap cancel`: end a rollout by hand, as the admin API's PATCH does.

A rollout made with `POST /admin/rollouts` for a harness started by hand has no runner to end
it: without these, ending it takes a curl call to a proxy that may no longer run. The store's
lifecycle decides what is allowed (an ended rollout stays as it ended: one line saying so); an
ended rollout is analyzed (segments, breaks, faithfulness) as the proxy would.
"""

from __future__ import annotations

import math

import click

from .options import db_option


def _end(db_url: str | None, given: str, status: str, reward: float | None) -> None:
    from ..analysis.reading import analyze_rollout
    from ..store import RolloutStatus
    from ..store import open as open_store
    from ..store.events import Declared

    with open_store(db_url) as store:
        rollout_id = store.resolve("rollout", given)
        values = {} if reward is None else {"reward": reward}
        wanted = RolloutStatus(status)

        async def end() -> str:
            view = await store.store.report(rollout_id, Declared(wanted), **values)
            if view.status != wanted:
                # Another writer ended it first; the store kept that ending.
                return f"rollout {rollout_id} had already ended {view.status.value}: left as it is"
            await analyze_rollout(store.store, rollout_id)
            shown = "" if view.reward is None else f", reward {view.reward:g}"
            return f"rollout {rollout_id} {view.status.value}{shown}"

        click.echo(store.run(end()))


def _reward(_: click.Context, __: click.Parameter, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter("must be a finite number")
    return value


@click.command()
@db_option
@click.argument("rollout_id")
@click.option(
    "--reward",
    type=float,
    default=None,
    callback=_reward,
    help="The reward to record (what the task's verifier gave); without it, none.",
)
def finish(db_url: str | None, rollout_id: str, reward: float | None) -> None:
    """End ROLLOUT_ID (an id or a unique prefix) as finished: its harness ended on its own."""
    _end(db_url, rollout_id, "finished", reward)


@click.command()
@db_option
@click.argument("rollout_id")
def cancel(db_url: str | None, rollout_id: str) -> None:
    """End ROLLOUT_ID (an id or a unique prefix) as cancelled: its key stops working."""
    _end(db_url, rollout_id, "cancelled", None)
