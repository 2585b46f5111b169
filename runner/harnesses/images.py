"""Docker build contexts for harness_images/<name>/Dockerfile (harness on top of a task image).

Build: `docker build --network host --build-arg BASE=<task image> <context>`; the harness lands at
`install.image_installation(harness).prefix`. The Dockerfiles ship as package data of
rolltap.harness_images (the top-level harness_images/ folder).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ... import harness_images
from .base import Harness
from .errors import HarnessError

IMAGES_DIR = Path(harness_images.__file__).resolve().parent


def dockerfile(harness: Harness) -> Path:
    path = IMAGES_DIR / harness.name / "Dockerfile"
    if not path.is_file():
        raise HarnessError(f"no Dockerfile for {harness.name} at {path}")
    return path


def host_ca_bundle() -> Path | None:
    """The CA bundle this host's pip and npm are told to trust, if any (TLS-intercepting
    networks); builds need it too."""
    for var in ("PIP_CERT", "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    return None


def build_context(harness: Harness, dest: Path, ca_bundle: Path | None = None) -> Path:
    """Fill `dest` with the harness's Dockerfile and, when given, the CA bundle to trust."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(dockerfile(harness), dest / "Dockerfile")
    if ca_bundle is not None:
        shutil.copyfile(ca_bundle, dest / "ca-certificates.crt")
    return dest
