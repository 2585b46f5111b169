"""rolltap's token-in parsers read every corpus text as vLLM's parser of the same name does,
whole, one character (vLLM: one token) at a time and in random chunks (parity.py), or the
difference is written down with its reason in parser_differences.json.

Each entry there names a reason and the cases (and ways) it explains: a difference no entry
explains fails, and so does an entry whose case no longer differs (the reason went stale).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.contract import parity

pytestmark = pytest.mark.contract

DIFFERENCES = Path(__file__).parent / "parser_differences.json"


def explained(name: str) -> dict[tuple[str, str], str]:
    """(case id, way) -> the reason rolltap reads it differently from vLLM."""
    entries = json.loads(DIFFERENCES.read_text(encoding="utf-8")).get(name, [])
    return {
        (case, mode): entry["reason"]
        for entry in entries
        for case, modes in entry["cases"].items()
        for mode in modes
    }


@pytest.mark.parametrize("name", sorted(parity.SUITES))
def test_each_corpus_has_at_least_fifty_texts(name: str) -> None:
    assert len(parity.cases(parity.SUITES[name].corpus)) >= 50


@pytest.mark.parametrize("name", sorted(parity.SUITES))
def test_rolltap_parses_the_corpus_as_vllm_does(vllm_parsers: None, name: str) -> None:
    suite = parity.SUITES[name]
    reasons = explained(name)
    unexplained: list[str] = []
    agreed: list[tuple[str, str]] = []
    for case in parity.cases(suite.corpus):
        for mode in parity.MODES:
            ours, theirs = parity.compare(suite, case, mode)
            key = (case["id"], mode)
            if ours == theirs:
                agreed.append(key)
            elif key not in reasons:
                unexplained.append(
                    f"{case['id']} {mode}: {case['text']!r}\n"
                    f"  rolltap {ours.describe()}\n  vLLM    {theirs.describe()}"
                )
    stale = sorted(key for key in agreed if key in reasons)
    assert not unexplained, (
        f"{len(unexplained)} reading(s) differ from vLLM's {name} with no written reason "
        f"(match vLLM, or add the reason to {DIFFERENCES.name}):\n" + "\n".join(unexplained)
    )
    assert not stale, f"these now read as vLLM reads them; drop their reasons: {stale}"
