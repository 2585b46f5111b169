"""Which reward-hack detectors run: the built-ins (detectors.py), installed entry points,
`ROLLTAP_DETECTORS`, and the names a user gives (analysis/hacks.py says how to write one)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from .detectors import BUILTIN
from .hacks import Detector

ENTRY_POINT_GROUP = "rolltap.detectors"
DETECTORS_VARIABLE = "ROLLTAP_DETECTORS"


class DetectorError(ValueError):
    """A detector named by the user that cannot be loaded; the message says why."""


def builtin_detectors() -> list[Detector]:
    return [factory() for factory in BUILTIN]


def load_detectors(names: Sequence[str] | None = None) -> list[Detector]:
    """The detectors to run: the built-ins, installed entry points, `ROLLTAP_DETECTORS`, then
    `names` (built-in names pick among the built-ins; a dotted path `module:attr` adds a user's;
    `-name` leaves one out). Two detectors with one name are refused."""
    chosen: dict[str, Detector] = {d.name: d for d in builtin_detectors()}
    builtin = set(chosen)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
        except Exception as e:  # a broken plugin is named, not a traceback of the runner
            raise DetectorError(f"entry point {ep.name} ({ep.value}): {e}") from e
        for d in _made(loaded, ep.value):
            _add(chosen, d, ep.value)
    extra = [n.strip() for n in os.environ.get(DETECTORS_VARIABLE, "").split(",") if n.strip()]
    only: set[str] = set()
    for name in [*extra, *(names or ())]:
        if name.startswith("-"):
            chosen.pop(name[1:], None)
            builtin.discard(name[1:])
        elif ":" in name:
            for d in _made(_import(name), name):
                _add(chosen, d, name)
        elif name in builtin:
            only.add(name)
        else:
            known = ", ".join(sorted(chosen))
            raise DetectorError(f"no detector {name!r}: known are {known}, or give module:attr")
    if only:
        # Naming built-ins picks them: the others are left out (user detectors stay).
        chosen = {n: d for n, d in chosen.items() if n in only or n not in builtin}
    return list(chosen.values())


def _made(loaded: Any, where: str) -> list[Detector]:
    """Detectors from what a dotted path or entry point names: an instance, a class, or a
    function returning one or a list."""
    made = loaded
    if isinstance(loaded, type) or (callable(loaded) and not isinstance(loaded, Detector)):
        made = loaded()
    items = list(made) if isinstance(made, list | tuple) else [made]
    for item in items:
        if not isinstance(item, Detector):
            raise DetectorError(f"{where} is not a detector (it needs `name` and `check`)")
    return items


def _add(chosen: dict[str, Detector], detector: Detector, where: str) -> None:
    if detector.name in chosen:
        raise DetectorError(f"{where}: a detector named {detector.name!r} is already loaded")
    chosen[detector.name] = detector


def _import(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise DetectorError(f"{path}: cannot import {module_name}: {e}") from e
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as e:
            raise DetectorError(f"{path}: {module_name} has no {attr}") from e
    return target
