"""The contract tests (`pytest -m contract`): rolltap against vLLM's and SGLang's own code, from
their wheels (.ci/setup-contract). Each module here carries the `contract` mark; a test needing a
wheel that is missing, or whose modules do not import here, skips with the reason."""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.contract import engines, harmony_vocab
from tests.support.proxy import OpenAIFactory


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-generated",
        action="store_true",
        help="test_parser_properties.py: write generated_differences.json, do not check it",
    )


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


@pytest.fixture(scope="session")
def vllm_parsers(tmp_path_factory: pytest.TempPathFactory) -> None:
    """vLLM's parsers import here (.ci/setup-contract), and gpt-oss's vocabulary is found."""
    for module in ("vllm.parser.parser_manager", "vllm.tool_parsers", "vllm.reasoning"):
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            pytest.skip(f"{module} does not import: run .ci/setup-contract")
    reason = harmony_vocab.install(tmp_path_factory.mktemp("o200k"))
    if reason is not None:
        pytest.skip(f"gpt-oss's Harmony encoding: {reason}")


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
    from tests.contract.test_parser_properties import TALLIES
    from tests.contract.test_requests import JUDGED

    tallies = terminalreporter.config.stash.get(TALLIES, {})
    if tallies:
        terminalreporter.section("generated answers judged against vLLM's parsers")
        for name, (judged, differing, hits) in sorted(tallies.items()):
            classes = ", ".join(f"{key} {n}" for key, n in sorted(hits.items())) or "none"
            terminalreporter.write_line(
                f"{name:30} {judged:3} texts, {differing:3} read differently; "
                f"readings per reason: {classes}"
            )

    judged = terminalreporter.config.stash.get(JUDGED, {})
    if judged:
        terminalreporter.section("engine requests judged by the engines' own models")
        for (engine, route), count in sorted(judged.items()):
            terminalreporter.write_line(f"{engine:7} {route:28} {count}")
