"""Ids on the command line: a unique prefix of a rollout or batch id stands for it
(store/lookup.py); an ambiguous one is refused in one line that says how many it begins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store import StoreReader


def batch_filter(store: StoreReader, given: str | None) -> str | None:
    """--batch: the batch it names or uniquely begins; a name no batch has stays as given, so
    the command says that nothing matches it."""
    from ..store import NotFound

    if given is None:
        return None
    try:
        return store.resolve("batch", given)
    except NotFound:
        return given
