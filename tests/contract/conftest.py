"""The contract tests (`pytest -m contract`): rolltap against vLLM's and SGLang's own code, from
their wheels (.ci/setup-contract). Each module here carries the `contract` mark; a test needing a
wheel that is missing, or whose modules do not import here, skips with the reason."""

from __future__ import annotations

import os
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.contract import engines
from tests.support.proxy import OpenAIFactory


def pytest_report_header() -> str:
    return (
        f"contract engines: vllm {engines.installed('vllm') or 'missing'}, "
        f"sglang {engines.installed('sglang') or 'missing'} "
        f"(documented: vllm {engines.VLLM}, sglang {engines.SGLANG})"
    )


@pytest.fixture(scope="package", autouse=True)
def _engines_leave_no_trace() -> Iterator[None]:
    """Importing vLLM sets environment variables and warning filters (torch inductor, triton,
    its own deprecations): the rest of the suite runs in this process without them."""
    environ, filters = dict(os.environ), list(warnings.filters)
    yield
    os.environ.clear()
    os.environ.update(environ)
    warnings.filters[:] = filters


@pytest.fixture(scope="session")
def vllm() -> None:
    """Skips the test unless vLLM's modules import here."""
    reason = engines.vllm_missing()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def sglang() -> engines.SGLang:
    loaded = engines.sglang_modules()
    if isinstance(loaded, str):
        pytest.skip(loaded)
    return loaded


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


@pytest.fixture
async def sdk() -> AsyncIterator[OpenAIFactory]:
    factory = OpenAIFactory()
    try:
        yield factory
    finally:
        await factory.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.contract.test_requests import JUDGED

    judged = terminalreporter.config.stash.get(JUDGED, {})
    if judged:
        terminalreporter.section("engine requests judged by the engines' own models")
        for (engine, route), count in sorted(judged.items()):
            terminalreporter.write_line(f"{engine:7} {route:28} {count}")
