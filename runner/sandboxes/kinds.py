"""Makes the provider of a sandbox kind by name (what `--sandbox KIND` on a command line means)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import SandboxProvider

KINDS = ("local", "bwrap", "docker", "apptainer")


async def make_provider(
    kind: str, *, root: Path | None = None, image: str | None = None
) -> SandboxProvider:
    """root: where workspaces live (local, bwrap, apptainer); image: the kind's default root
    (bwrap: a rootfs directory; docker: the base image; apptainer: a SIF or sandbox dir).
    Raises SandboxUnavailable when the kind cannot run here."""
    # Each kind's module is loaded when it is asked for: the docker SDK (requests, urllib3) is
    # most of what naming the kinds cost (`rolltap run --help`).
    if kind == "local":
        from .local import LocalProvider

        return LocalProvider(root)
    if kind == "bwrap":
        from .bwrap import BwrapProvider

        return BwrapProvider(root, rootfs=Path(image) if image else None)
    if kind == "docker":
        from .docker import DockerProvider

        if image:
            return await DockerProvider.connect(base_image=image)
        return await DockerProvider.connect()
    if kind == "apptainer":
        from .apptainer import ApptainerProvider

        return ApptainerProvider(root, image=image)
    raise ValueError(f"unknown sandbox kind {kind!r}; choose from {', '.join(KINDS)}")
