"""Ids on the command line: a unique prefix of a rollout or batch id stands for it
(store/lookup.py); an ambiguous one is refused in one line that says how many it begins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..store.listing import Kind


class Resolver(Protocol):
    """A store's reader (`StoreReader`, or `ls`'s plain SQLite `Listing`)."""

    def resolve(self, kind: Kind, given: str) -> str: ...


def batch_filter(store: Resolver, given: str | None) -> str | None:
    """--batch: the batch it names or uniquely begins; a name no batch has stays as given, so
    the command says that nothing matches it."""
    from ..store import NotFound

    if given is None:
        return None
    try:
        return store.resolve("batch", given)
    except NotFound:
        return given
