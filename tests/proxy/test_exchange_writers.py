"""A call's `Exchange` is written only by its own methods (proxy/upstream/exchange.py).

Its parts are replaced whole by the method named for what happened (`understood`, `sent`,
`answered`, ...); only the engine's answer, an accumulator, is written field by field by the
answer sources that read it. This reads the proxy's modules as text and finds every assignment
to an attribute reached through an exchange, the way a reader following one would.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "proxy"
OWN = PROXY / "upstream" / "exchange.py"
# The answer sources: they write the engine's answer (`Answer`) as they read it.
ANSWER_SOURCES = {PROXY / "upstream" / "call.py", PROXY / "replay" / "recorded.py"}


def _names(node: ast.expr) -> list[str]:
    """`self._exchange.answer.usage` -> ["self", "_exchange", "answer", "usage"]."""
    out: list[str] = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        out.append(node.id)
    return out[::-1]


def _targets(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            found += node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            found.append(node.target)
    return found


def writes(path: Path, *, answer_source: bool = False) -> list[str]:
    """`line target` for each assignment through an exchange in `path`, or through an answer
    unless the file is an `answer_source`."""
    found = []
    for target in _targets(ast.parse(path.read_text())):
        names = _names(target)
        through = {n.lstrip("_") for n in names[:-1]}
        if "exchange" in through or ("answer" in through and not answer_source):
            found.append(f"{target.lineno} {'.'.join(names)}")
    return found


def test_only_the_exchange_writes_itself() -> None:
    found = {
        str(p.relative_to(ROOT)): w
        for p in sorted(PROXY.rglob("*.py"))
        if p != OWN and (w := writes(p, answer_source=p in ANSWER_SOURCES))
    }
    assert found == {}


def test_the_check_finds_a_write(tmp_path: Path) -> None:
    handler = tmp_path / "handler.py"
    handler.write_text(
        "def f(taken, self, exchange):\n"
        "    taken.exchange.stream = True\n"
        "    self._exchange.notes += ['x']\n"
        "    taken.exchange.answer.usage = {}\n"
        "    exchange.notes.append('said')\n"
        "    self._answer.usage = {}\n"
    )
    assert writes(handler) == [
        "2 taken.exchange.stream",
        "3 self._exchange.notes",
        "4 taken.exchange.answer.usage",
        "6 self._answer.usage",
    ]
    assert writes(handler, answer_source=True) == writes(handler)[:3]
