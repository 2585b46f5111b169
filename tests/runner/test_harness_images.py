"""harness_images/<name>/Dockerfile agrees with its adapter: same pins, same prefix, any base."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.runner.harnesses import Harness, adapters, image_installation
from rolltap.runner.harnesses.images import build_context, dockerfile

IMAGES = Path(__file__).resolve().parents[2] / "harness_images"


def test_the_dockerfiles_are_found_in_the_source_tree() -> None:
    assert dockerfile(adapters()["codex"]) == IMAGES / "codex" / "Dockerfile"


@pytest.mark.parametrize("harness", list(adapters().values()), ids=lambda h: h.name)
def test_dockerfile_installs_the_adapters_packages_where_it_looks(harness: Harness) -> None:
    text = (IMAGES / harness.name / "Dockerfile").read_text()
    inside = image_installation(harness)

    assert "ARG BASE" in text
    assert "FROM ${BASE}" in text
    for requirement in harness.packages.requirements:
        assert requirement in text
    assert str(inside.prefix) in text
    assert not inside.mounts


def test_a_build_context_carries_the_dockerfile_and_the_ca_bundle(tmp_path: Path) -> None:
    harness = adapters()["codex"]
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")

    context = build_context(harness, tmp_path / "ctx", bundle)

    assert (context / "Dockerfile").read_text() == dockerfile(harness).read_text()
    assert (context / "ca-certificates.crt").read_text() == bundle.read_text()
    assert not (build_context(harness, tmp_path / "plain") / "ca-certificates.crt").exists()
