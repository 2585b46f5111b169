"""Answers built from each parser family's grammar, for the property tests
(test_parser_properties.py).

A strategy per corpus (parity.Suite.corpus names the format): content, tool calls with the
tools of parity.TOOLS and arguments a coding agent writes (quotes, backslashes, newlines,
unicode, nested JSON, shell commands with heredocs), reasoning open, closed or absent where the
family reasons, every call written the ways the corpus writers write it (make_corpus.py), and
the answer sometimes cut at any position, as the token limit cuts it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from tests.contract import make_corpus as mc

Args = dict[str, Any]
Writer = Callable[[random.Random, str, Args], str]

# Characters an answer's strings are made of: plain text, the ones JSON and shells escape, and
# unicode from every plane the tokenizer splits differently (a line separator, an emoji).
_CHARS = st.sampled_from(
    [*"abcxyz019 _-./:=", "\n", "\t", '"', "'", "\\", "$", "é", "東", "🎉", "\u2028", "ü"]
)
_text = st.text(_CHARS, max_size=24)

_HEREDOC = st.builds(
    lambda name, body, tag: f"cat <<'{tag}' > {name}\n{body}\n{tag}\n",
    st.sampled_from(["a.py", "notes.md", "x y.txt"]),
    _text,
    st.sampled_from(["EOF", "PY"]),
)
_COMMAND = st.one_of(
    _HEREDOC,
    st.builds(lambda a, b: f"echo \"{a}\" && grep -rn '{b}' .", _text, _text),
    st.builds(lambda a: f"printf '%s\\n' {json.dumps(a)} | sed 's/a/b/g'", _text),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)

_ARGS: dict[str, st.SearchStrategy[Args]] = {
    "get_weather": st.fixed_dictionaries(
        {"city": _text}, optional={"days": st.integers(0, 30), "metric": st.booleans()}
    ),
    "run": st.fixed_dictionaries(
        {"command": _COMMAND}, optional={"timeout": st.integers(1, 600) | st.just(2.5)}
    ),
    "write_file": st.fixed_dictionaries({"path": _text, "content": _text | _COMMAND}),
    "search": st.fixed_dictionaries(
        {"query": _text},
        optional={
            "filters": st.dictionaries(_text, _JSON, max_size=3),
            "tags": st.lists(_text, max_size=3),
        },
    ),
    "noop": st.just({}),
}


@st.composite
def _call(draw: st.DrawFn) -> tuple[str, Args]:
    name = draw(st.sampled_from(sorted(_ARGS)))
    return name, draw(_ARGS[name])


_calls = st.lists(_call(), min_size=1, max_size=3)
_content = st.sampled_from(mc.CONTENT) | _text


@st.composite
def _cut(draw: st.DrawFn, text: str) -> str:
    """The answer whole, mostly, or cut at any position (the token limit)."""
    if not text or draw(st.integers(0, 3)) > 0:
        return text
    return text[: draw(st.integers(0, len(text) - 1))]


@st.composite
def _tagged(draw: st.DrawFn, write: Writer, null: bool = False) -> str:
    """Content, then calls between content (hermes, qwen3_coder, glm45)."""
    rng = draw(st.randoms(use_true_random=False))
    calls = [write(rng, n, a) for n, a in draw(_calls)]
    if null and draw(st.integers(0, 9)) == 0:
        calls.append(write(rng, "noop", None))  # `arguments: null` (hermes)
    text = draw(_content) + "\n".join(calls) + draw(st.sampled_from(["", "\n", "Done."]))
    return draw(_cut(text))


@st.composite
def _llama3(draw: st.DrawFn) -> str:
    rng = draw(st.randoms(use_true_random=False))
    calls = [mc.llama3_call(rng, n, a) for n, a in draw(_calls)]
    head = draw(st.sampled_from(["", "<|python_tag|>"]))
    return draw(_cut(head + draw(st.sampled_from(["; ", ";"])).join(calls)))


@st.composite
def _mistral(draw: st.DrawFn) -> str:
    rng = draw(st.randoms(use_true_random=False))
    entries = [{"name": n, "arguments": a} for n, a in draw(_calls)]
    return draw(_cut(draw(_content) + "[TOOL_CALLS]" + mc._dumps(rng, entries)))


@st.composite
def _mistral_v11(draw: st.DrawFn) -> str:
    rng = draw(st.randoms(use_true_random=False))
    calls = "".join(mc.mistral_v11_call(rng, n, a) for n, a in draw(_calls))
    return draw(_cut(draw(_content) + calls))


@st.composite
def _section(draw: st.DrawFn, kind: str) -> str:
    rng = draw(st.randoms(use_true_random=False))
    found = draw(_calls)
    if kind == "kimi":
        begin, end = mc.KIMI_SECTION
        calls = "".join(mc.kimi_call(rng, n, a, k) for k, (n, a) in enumerate(found))
    else:
        begin, end = mc.V31_SECTION
        calls = "".join(mc.v31_call(rng, n, a) for n, a in found)
    return draw(_cut(draw(_content) + begin + calls + end))


_THOUGHT = st.sampled_from(mc.THOUGHTS) | _text


@st.composite
def _thought(draw: st.DrawFn, opened_by_prompt: bool) -> str:
    """A reasoning block: closed (opened by the model or by the prompt), unclosed, or none."""
    thought = draw(_THOUGHT)
    shape = draw(st.sampled_from(["closed", "opened", "unclosed", "none"]))
    gap = draw(st.sampled_from(["", "\n\n"]))
    if shape == "none":
        return ""
    if shape == "unclosed":
        return draw(st.sampled_from(["", "<think>"])) + thought
    start = "<think>" if shape == "opened" else ""
    if opened_by_prompt and start and draw(st.booleans()):
        start = "<think>\n"
    return f"{start}{thought}</think>{gap}"


@st.composite
def _reasoning(draw: st.DrawFn, opened_by_prompt: bool) -> str:
    head = draw(_thought(opened_by_prompt))
    rest = "" if head and "</think>" not in head else draw(_content)
    if not opened_by_prompt and draw(st.integers(0, 4)) == 0:  # Qwen3 calling straight away
        rng = draw(st.randoms(use_true_random=False))
        rest += mc.hermes_call(rng, *draw(_call()))
    return draw(_cut(head + rest))


@st.composite
def _qwen3_tools(draw: st.DrawFn, write: Writer) -> str:
    head = draw(_thought(False))
    rng = draw(st.randoms(use_true_random=False))
    calls = "\n".join(write(rng, n, a) for n, a in draw(_calls))
    content = draw(_content) if "</think>" in head or not head else ""
    return draw(_cut(head + content + calls + draw(st.sampled_from(["", "\n", "Done."]))))


@st.composite
def _harmony(draw: st.DrawFn) -> str:
    parts = []
    head = ""
    if draw(st.booleans()):
        parts.append(f"<|channel|>analysis<|message|>{draw(_THOUGHT)}<|end|>")
        head = "<|start|>assistant"
    if draw(st.booleans()):
        rng = draw(st.randoms(use_true_random=False))
        call = mc.harmony_call(rng, *draw(_call()))
        parts.append(call if head else call.removeprefix("<|start|>assistant"))
    else:
        parts.append(f"{head}<|channel|>final<|message|>{draw(_content)}<|return|>")
    return draw(_cut("".join(parts)))


def _null_hermes(rng: random.Random, name: str, args: Args | None) -> str:
    """hermes_call, with `arguments: null` when `args` is None."""
    if args is None:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": None}) + "\n</tool_call>"
    return mc.hermes_call(rng, name, args)


ANSWERS: dict[str, st.SearchStrategy[str]] = {
    "hermes": _tagged(_null_hermes, null=True),
    "qwen3_coder": _tagged(mc.qwen3_coder_call),
    "llama3_json": _llama3(),
    "mistral": _mistral(),
    "mistral_v11": _mistral_v11(),
    "glm45": _tagged(mc.glm45_call),
    "kimi_k2": _section("kimi"),
    "deepseek_v31": _section("v31"),
    "reasoning-qwen3": _reasoning(False),
    "reasoning-deepseek_r1": _reasoning(True),
    "qwen3-hermes": _qwen3_tools(mc.hermes_call),
    "qwen3-xml": _qwen3_tools(mc.qwen3_coder_call),
    "openai": _harmony(),
}
"""Corpus name (the format) -> answers of that format."""
