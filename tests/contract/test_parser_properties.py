"""Property tests: answers built from each parser family's grammar (grammars.py), read by
rolltap whole, one character at a time and in random chunks, and by vLLM's parser of the same
name the same three ways (parity.py). For every generated text two properties hold:

(a) rolltap's streamed readings add up to its whole reading (content beside calls compared as
    a whole answer settles it), unless the stream opened a call the text then broke
    (`rolltap_stream_break`: a sent call cannot be taken back);
(b) every reading is vLLM's, unless the difference falls into a class that
    generated_differences.json lists for the suite, with its reason; triage.reasons decides
    the class of a difference, a rule per class, as it does for the corpora.

Generated texts have no stable ids, so the file lists classes, not cases: a difference no
listed class explains fails, and so does a listed class no generated text falls into any more
(its reason went stale). Hypothesis runs derandomized (the same texts every run), with no
example database and a bounded number of texts per suite.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Collection
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings

from tests.contract import grammars, parity, triage

pytestmark = pytest.mark.contract

GENERATED = Path(__file__).parent / "generated_differences.json"
EXAMPLES = 45
SEED = 34
"""Hypothesis draws the same texts every run from this seed."""
WRITE = "--write-generated"
"""pytest option: write each suite's classes to generated_differences.json instead of checking
them (`pytest -m contract tests/contract/test_parser_properties.py --write-generated`; the
texts Hypothesis draws under pytest are the ones the check sees)."""
"""Texts per suite (about 0.1 s each on one core: vLLM's parsers dominate)."""

Tally = tuple[int, int, Counter[str]]
TALLIES = pytest.StashKey[dict[str, Tally]]()
"""Suite -> (texts judged, texts read differently, differing readings per class), printed at
the end (conftest.py)."""


def listed(name: str) -> dict[str, str]:
    """The classes of difference the suite's generated texts are allowed: key -> reason."""
    return dict(json.loads(GENERATED.read_text(encoding="utf-8")).get(name, {}))


def _write(name: str, hits: Counter[str]) -> None:
    current = json.loads(GENERATED.read_text(encoding="utf-8")) if GENERATED.exists() else {}
    current[name] = {key: triage.REASONS[key] for key in sorted(hits)}
    text = json.dumps(dict(sorted(current.items())), indent=1, ensure_ascii=False) + "\n"
    GENERATED.write_text(text, encoding="utf-8")


def read_all(suite: parity.Suite, text: str) -> triage.Read:
    seed = hashlib.sha256(text.encode()).hexdigest()[:12]
    return {m: parity.compare(suite, {"id": seed, "text": text}, m) for m in parity.MODES}


def own_disagreement(suite: parity.Suite, text: str, read: triage.Read) -> dict[str, str | None]:
    """Ways rolltap's stream does not add up to its whole reading -> the class that explains
    it (None: none)."""
    whole = triage.settled(read["whole"][0])
    broke = parity.rolltap_outcome(suite, text).startswith("malformed")
    return {
        mode: "rolltap_stream_break" if broke else None
        for mode in parity.MODES[1:]
        if triage.settled(read[mode][0]) != whole
    }


def _describe(text: str, mode: str, read: triage.Read, against: str) -> str:
    ours, theirs = read[mode]
    other = read["whole"][0] if against == "rolltap whole" else theirs
    return (
        f"{mode} vs {against}: {text!r}\n  rolltap {ours.describe()}\n"
        f"  {against:7} {other.describe()}"
    )


def judge(name: str, allowed: Collection[str]) -> Tally:
    """The suite's generated texts judged: an assertion error on the first whose difference
    falls into no class of `allowed` (Hypothesis shrinks it first), else the tally."""
    suite = parity.SUITES[name]
    hits: Counter[str] = Counter()
    judged, differing = [0], [0]

    @seed(SEED)
    @settings(
        max_examples=EXAMPLES,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(text=grammars.ANSWERS[suite.corpus])
    def check(text: str) -> None:
        read = read_all(suite, text)
        found = [
            (key, _describe(text, mode, read, "rolltap whole"))
            for mode, key in own_disagreement(suite, text, read).items()
        ] + [
            (key, _describe(text, mode, read, "vLLM"))
            for mode, key in triage.reasons(suite, text, read).items()
        ]
        bad = [f"[{key or 'no reason'}] {line}" for key, line in found if key not in allowed]
        assert not bad, (
            f"{name}: a generated answer reads differently with no listed reason (match vLLM, "
            f"or give the class a rule in triage.py and list it: {WRITE}):\n" + "\n".join(bad)
        )
        judged[0] += 1
        differing[0] += bool(found)
        hits.update(key for key, _ in found if key is not None)

    check()
    return judged[0], differing[0], hits


@pytest.mark.parametrize("name", sorted(parity.SUITES))
def test_generated_answers_read_as_vllm_reads_them(
    vllm_parsers: None, name: str, request: pytest.FixtureRequest
) -> None:
    if request.config.getoption(WRITE):
        _write(name, judge(name, triage.REASONS)[2])
        return
    allowed = listed(name)
    assert all(allowed[key] == triage.REASONS.get(key) for key in allowed), (
        f"{name}: a reason in {GENERATED.name} is not triage.REASONS' text for its class"
    )
    tally = judge(name, allowed)
    request.config.stash.setdefault(TALLIES, {})[name] = tally
    stale = sorted(set(allowed) - set(tally[2]))
    assert not stale, (
        f"{name}: no generated answer differs from vLLM in these listed classes any more; "
        f"drop them from {GENERATED.name} ({WRITE}): {stale}"
    )
