"""What changes a batch's outcome, recorded on each of its rollouts as `meta["settings"]`.

Resuming a batch keeps its finished rollouts, so a rerun with another model, backend, budget or
limit would silently mix two experiments: `check_resumable` refuses it, naming each flag that
differs. Settings that only change how fast a batch runs (concurrency, retries) are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..proxy.upstream.backends import parse_backend


class BatchSettingsChanged(Exception):
    """A batch was resumed with settings other than those its rollouts ran with."""


@dataclass(frozen=True)
class BatchSettings:
    harness: str
    model: str
    backends: tuple[str, ...]
    """The backends' kinds (vllm, sglang, openai), or ("built-in", MODEL, *ENGINE_ARGS) for the
    built-in engine. Not their URLs: a server restarted on another port serves the same."""
    sandbox: str
    sandbox_image: str | None
    max_calls: int | None
    max_tokens: int | None
    max_tokens_cap: int | None
    max_steps: int | None
    timeout: float | None
    egress: str | None = None
    """The egress mode and its allow-list (None: no egress gate)."""
    keep_git_history: bool | None = None
    """True: tasks kept their git history beyond the base commit (None: pruned, the default)."""

    @classmethod
    def of(
        cls,
        *,
        harness: str,
        model: str,
        backends: Sequence[str],
        engine_model: str | None,
        engine_args: Sequence[str],
        **rest: Any,
    ) -> BatchSettings:
        kinds = tuple(sorted({parse_backend(spec)[1].value for spec in backends}))
        used = kinds or ("built-in", engine_model or "default", *engine_args)
        return cls(harness=harness, model=model, backends=used, **rest)

    def as_meta(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


_FLAGS = {
    "harness": "--harness",
    "model": "--model",
    "backends": "--backend/--engine-model/--engine-arg",
    "sandbox": "--sandbox",
    "sandbox_image": "--sandbox-image",
    "max_calls": "--max-calls",
    "max_tokens": "--max-tokens",
    "max_tokens_cap": "--max-tokens-cap",
    "max_steps": "--max-steps",
    "timeout": "--timeout",
    "egress": "--egress/--allow-host",
    "keep_git_history": "--keep-git-history",
}


def check_resumable(
    batch_id: str, settings: BatchSettings, recorded: Iterable[Mapping[str, Any]]
) -> None:
    """Raise BatchSettingsChanged when any rollout of the batch ran with other settings.

    `recorded`: the batch's rollouts' meta; those without settings (older runs) are not judged.
    """
    now = settings.as_meta()
    for meta in recorded:
        before = meta.get("settings")
        if not isinstance(before, dict):
            continue
        # A setting recorded before it existed reads as unset.
        changes = [
            f"{_FLAGS[k]} {_show(before.get(k))} -> {_show(v)}"
            for k, v in now.items()
            if before.get(k) != v
        ]
        if not changes:
            continue
        raise BatchSettingsChanged(
            f"batch {batch_id} ran with other settings ({'; '.join(changes)}): rerun with its "
            "settings to resume it, or name a new batch with --batch"
        )


def _show(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)
