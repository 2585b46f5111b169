"""Task images for the docker kind (blocking, for a pool thread): a named image found or pulled,
or environment/ built locally under a tag that hashes its content, so a rebuild happens only
when the environment changes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import docker
import docker.errors

from .errors import ImageBuildError
from .workspace import label

HARNESS_BUILD_TIMEOUT = 1800.0
"""Installing a harness (pip or npm) into an image can take minutes on a cold cache."""


def task_tag(task_id: str, context: Path) -> str:
    return f"rolltap-task/{label(task_id).lower()}:{content_hash(context)}"


def harness_hash(base_image_id: str, context: Path) -> str:
    """Changes when the task image or the harness's build context does."""
    return hashlib.sha256(f"{base_image_id}|{content_hash(context)}".encode()).hexdigest()[:16]


def image_id(api: docker.APIClient, name: str) -> str:
    return str(api.inspect_image(name)["Id"])


def has_image(api: docker.APIClient, name: str) -> bool:
    try:
        api.inspect_image(name)
    except docker.errors.ImageNotFound:
        return False
    return True


def ensure_image(client: docker.DockerClient, name: str) -> None:
    if has_image(client.api, name):
        return
    try:
        client.images.pull(name)
    except docker.errors.DockerException as e:
        raise ImageBuildError(f"image {name} is not present and cannot be pulled: {e}") from e


def build_image(
    api: docker.APIClient,
    context: Path,
    tag: str,
    labels: dict[str, str],
    timeout: float,
    buildargs: dict[str, str] | None = None,
    network_mode: str | None = None,
) -> None:
    lines: list[str] = []
    try:
        for item in api.build(
            path=str(context), tag=tag, rm=True, forcerm=True, decode=True, labels=labels,
            timeout=int(timeout), buildargs=buildargs, network_mode=network_mode,
        ):  # fmt: skip
            if "error" in item:
                raise ImageBuildError(f"building {context}: {item['error'].strip()}")
            lines.append(str(item.get("stream", "")))
    except docker.errors.DockerException as e:
        tail = "".join(lines)[-1000:]
        raise ImageBuildError(f"building {context} failed: {e}\n{tail}") from e


def content_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_symlink():
            digest.update(f"L{rel}\0{os.readlink(path)}\0".encode())
        elif path.is_file():
            digest.update(f"F{rel}\0{path.stat().st_mode & 0o777}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
