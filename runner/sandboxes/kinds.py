"""Makes the provider of a sandbox kind by name (what `--sandbox KIND` on a command line means)."""

from __future__ import annotations

from pathlib import Path

from .apptainer import ApptainerProvider
from .base import SandboxProvider
from .bwrap import BwrapProvider
from .docker import DockerProvider
from .local import LocalProvider

KINDS = ("local", "bwrap", "docker", "apptainer")


async def make_provider(
    kind: str, *, root: Path | None = None, image: str | None = None
) -> SandboxProvider:
    """root: where workspaces live (local, bwrap, apptainer); image: the kind's default root
    (bwrap: a rootfs directory; docker: the base image; apptainer: a SIF or sandbox dir).
    Raises SandboxUnavailable when the kind cannot run here."""
    if kind == "local":
        return LocalProvider(root)
    if kind == "bwrap":
        return BwrapProvider(root, rootfs=Path(image) if image else None)
    if kind == "docker":
        if image:
            return await DockerProvider.connect(base_image=image)
        return await DockerProvider.connect()
    if kind == "apptainer":
        return ApptainerProvider(root, image=image)
    raise ValueError(f"unknown sandbox kind {kind!r}; choose from {', '.join(KINDS)}")
