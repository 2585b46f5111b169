"""Which served model answers the `model` a client asks for: aliases, and the one-model default.

Harnesses with fixed model names (Claude Code asks for its own model ids) work against any
backend: `--model-alias NAME=SERVED` maps a name (`*`: every name not served), and when the
backends serve exactly one model, a call asking for another is answered by it. The call records
the name asked for; its engine request, the model that answered. With several models served and
no alias, a name none of them serves is refused with a 404 listing what is served.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..errors import NotFoundError

ANY = "*"


def parse_alias(spec: str) -> tuple[str, str]:
    """`NAME=SERVED` (NAME may be `*`); ValueError otherwise."""
    name, _, served = spec.partition("=")
    if not name.strip() or not served.strip():
        raise ValueError(f"{spec!r} is not NAME=SERVED")
    return name.strip(), served.strip()


class ModelNames:
    def __init__(self, aliases: Mapping[str, str] | None = None) -> None:
        self._aliases = dict(aliases or {})
        self._served: frozenset[str] = frozenset()

    def learn(self, served: Iterable[str]) -> None:
        """The models the backends list (GET /v1/models); until known, names pass unchanged."""
        self._served = frozenset(served)

    @property
    def served(self) -> frozenset[str]:
        return self._served

    def resolve(self, asked: str | None) -> str | None:
        """The served model that answers `asked`; NotFoundError when none does."""
        if asked is None:
            return None
        if asked in self._aliases:
            return self._aliases[asked]
        if not self._served or asked in self._served:
            return asked
        if ANY in self._aliases:
            return self._aliases[ANY]
        if len(self._served) == 1:
            return next(iter(self._served))
        raise NotFoundError(
            f"model {asked!r} is not served here; served: {', '.join(sorted(self._served))} "
            "(`rolltap serve --model-alias NAME=SERVED` maps a name)",
            code="model_not_found",
        )
