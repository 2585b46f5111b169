"""What a resumed batch is compared on (runner/settings.py)."""

from __future__ import annotations

import dataclasses

import pytest

from rolltap.runner.settings import BatchSettings, BatchSettingsChanged, check_resumable


def _settings(backends: list[str]) -> BatchSettings:
    return BatchSettings.of(
        harness="mini-swe-agent",
        model="m",
        backends=backends,
        engine_model=None,
        engine_args=(),
        sandbox="bwrap",
        sandbox_image=None,
        max_calls=100,
        max_tokens=None,
        max_tokens_cap=None,
        max_steps=None,
        timeout=None,
    )


BASE = _settings(["http://127.0.0.1:8000"])


def test_a_backend_on_another_port_is_the_same_backend() -> None:
    moved = _settings(["vllm=http://10.0.0.2:9000/v1"])
    check_resumable("b", moved, [{"settings": BASE.as_meta()}])


def test_a_setting_recorded_before_it_existed_reads_as_unset() -> None:
    older = {k: v for k, v in BASE.as_meta().items() if k != "egress"}
    check_resumable("b", BASE, [{"settings": older}, {}])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"egress": "allowlist pypi.org"}, "--egress/--allow-host unset -> allowlist pypi.org"),
        (
            {"backends": ("built-in", "default")},
            "--backend/--engine-model/--engine-arg vllm -> built-in default",
        ),
        ({"model": "other"}, "--model m -> other"),
    ],
)
def test_what_changes_the_outcome_is_refused_by_name(change: dict[str, object], named: str) -> None:
    with pytest.raises(BatchSettingsChanged, match=named):
        check_resumable("b", dataclasses.replace(BASE, **change), [{"settings": BASE.as_meta()}])  # type: ignore[arg-type]
