"""Write parser_differences.json: every reading where rolltap and vLLM differ, with its reason.

    python -m tests.contract.triage            # after .ci/setup-contract

Runs every parity suite (parity.py), sorts each difference under one of the reasons below (a
rule per reason, first that fits), and writes the file the contract test reads; a difference
no rule fits is printed and fails the run, to be matched (fix rolltap) or given a reason here.
The file is checked in: `pytest -m contract` then fails on any difference it does not list.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.contract import harmony_vocab, parity
from tests.contract.test_parser_parity import DIFFERENCES

REASONS = {
    "cut": (
        "A call cut off (at the token limit) or broken inside: vLLM still makes a call of it "
        "with what it could read (arguments {}, a partial or invalid JSON string), so a harness "
        "runs a call the model never finished. vLLM is wrong (its own hermes parser gives such "
        "text back as content). rolltap gives the text back as content, verbatim, and records "
        "the answer's tool_parse as malformed."
    ),
    "all_or_nothing": (
        "One malformed call beside well-formed ones: vLLM's whole answer drops every call and "
        "returns the whole text as content, while its own stream sends the well-formed calls. "
        "vLLM is wrong: well-formed calls are lost. rolltap keeps them and gives the malformed "
        "one's text as content (tool_parse malformed)."
    ),
    "not_object": (
        "The arguments are not a JSON object: vLLM passes a JSON string (the object encoded "
        "twice), a list or invalid JSON through as `arguments`; OpenAI's `arguments` is a JSON "
        "object, which clients parse. vLLM is wrong. rolltap reads a JSON string holding an "
        "object as that object and gives anything else back as content (tool_parse malformed)."
    ),
    "null_arguments": (
        "Arguments written as `null`: vLLM passes the text `null` on as `arguments` (its "
        "mistral parser reads it as `{}`, some of its streams send nothing), which no client "
        "reads as the JSON object OpenAI's `arguments` is. rolltap reads `null` as no "
        "arguments, `{}`, whole and streamed alike (chatformat/tools.py NULL_ARGUMENTS)."
    ),
    "no_name": (
        'A call without a name: vLLM returns a call named "" that no client can dispatch. '
        "vLLM is wrong. rolltap gives the text back as content (tool_parse malformed)."
    ),
    "drops_text": (
        "vLLM drops text the model wrote (a block that is no call of this format, a marker "
        "with nothing after it): the client never sees it. vLLM is wrong. rolltap gives it "
        "back as content, verbatim (tool_parse malformed)."
    ),
    "function_without_tool_call": (
        "`<function=...>` with no `<tool_call>` before it: vLLM's qwen3 parser makes a call of "
        "it anyway. vLLM is wrong for an agent: prose or code that shows the format (a README, "
        "a test fixture) becomes a call the harness runs. rolltap reads calls only inside "
        "`<tool_call>`, as the Qwen3 templates write them, and records the text as malformed."
    ),
    "llama3_prose": (
        "Text before the JSON: vLLM's whole llama3_json answer takes any JSON object with a "
        "name anywhere in the text as a call and drops the text, while its own stream sends "
        "the answer as content. vLLM is wrong (a Llama 3 call is the whole answer, after an "
        "optional <|python_tag|>). rolltap follows the format and vLLM's stream: content."
    ),
    "mistral_marker": (
        "A malformed or empty [TOOL_CALLS]: vLLM returns only the text after the marker (the "
        "content before it and the marker are lost) and streams nothing of it. vLLM is wrong. "
        "rolltap gives the whole text back as content, verbatim (tool_parse malformed)."
    ),
    "mistral_json_in_v11": (
        "A JSON list of calls (the format before tokenizer v11) after [TOOL_CALLS] from a "
        "model whose tokenizer has [ARGS]: vLLM reads it as v11's NAME{...} and makes a call "
        "named `[` with the list's first object for its arguments. vLLM is wrong: no tool has "
        "that name. rolltap tells the formats apart by the text and reads the list's calls."
    ),
    "qwen3_off_think_end": (
        "Thinking off (`enable_thinking: false`): vLLM's qwen3 reasoning parser chained with "
        "qwen3_xml (one engine reads both) drops each `</think>` from the content and keeps "
        "`<think>`, while its qwen3 alone, or with hermes, gives the answer verbatim. vLLM is "
        "wrong: text the model wrote is lost, and only one of the two tags. rolltap gives the "
        "answer verbatim whatever the tool parser, as vLLM's qwen3 alone does."
    ),
    "vllm_stream": (
        "vLLM's stream of this text does not add up to its own whole answer (content after "
        "the calls sent, or text withheld and never sent, a broken call streamed, <think> "
        "left in the reasoning, calls after the first lost). vLLM is wrong: a client must get "
        "the same answer streamed or not. rolltap's stream adds up to vLLM's whole answer."
    ),
    "vllm_chunking": (
        "vLLM's stream of this text depends on how its tokens fall into deltas: sent one token "
        "at a time it reads as rolltap's stream does, in runs of several tokens it sends other "
        "text (spaces before a call dropped, arguments cut short). vLLM is wrong: a client "
        "must get the same answer however the engine batches its deltas. rolltap's stream "
        "does not depend on the pieces it is pushed in."
    ),
    "rolltap_stream_break": (
        "Streamed, rolltap opened the call (id and name sent) before the text showed it "
        "broken; a sent call cannot be taken back, so it ends with the arguments sent so far, "
        "as vLLM's streaming parsers end a broken call (README, Token-in), while the whole "
        "answer gives the text as content; vLLM sends other pieces of the broken call. Both "
        "leave a broken call (tool_parse malformed); a stream cannot do better without "
        "holding every call back to its end."
    ),
}


def _calls(answer: dict[str, Any]) -> list[list[str]]:
    return list(answer["calls"])


def _whole_reason(
    suite: parity.Suite, text: str, ours: dict[str, Any], theirs: dict[str, Any]
) -> str | None:
    mine, vllm = _calls(ours), _calls(theirs)
    if any(name == "" for name, _ in vllm):
        return "no_name"
    if _null_arguments(mine, vllm):
        return "null_arguments"
    if suite.family == "mistral_v11" and any(name.startswith("[") for name, _ in vllm):
        return "mistral_json_in_v11"
    if suite.tool in ("qwen3_coder", "qwen3_xml") and text.count("<function=") > text.count(
        "<tool_call>"
    ):
        return "function_without_tool_call"
    if suite.tool == "llama3_json" and len(vllm) > len(mine):
        head = text.lstrip()
        if not head.startswith(("{", "<|python_tag|>")):
            return "llama3_prose"
    bad = [args for _, args in vllm if not args.startswith("{")]
    if bad and len(vllm) >= len(mine):
        return "cut" if any(a.startswith("partial:") for a in bad) else "not_object"
    if len(vllm) > len(mine):
        return "cut"
    if mine and not vllm:
        return "all_or_nothing"
    if suite.tool == "mistral" and "[TOOL_CALLS]" in ours["content"]:
        return "mistral_marker"
    if _think_end_dropped(suite, ours, theirs) and mine == vllm:
        return "qwen3_off_think_end"
    if len(ours["content"]) > len(theirs["content"]) and mine == vllm:
        return "drops_text"
    if mine != vllm and len(mine) == len(vllm):
        names = [n for n, _ in mine] == [n for n, _ in vllm]
        if names and any(a.startswith("partial:") for _, a in vllm):
            return "cut"
    return None


def _think_end_dropped(suite: parity.Suite, ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """Thinking off, and vLLM's content is rolltap's without its `</think>`s."""
    if ("enable_thinking", False) not in suite.template_kwargs or "</think>" not in ours["content"]:
        return False
    return bool(ours["content"].replace("</think>", "") == theirs["content"])


def _null_arguments(mine: list[list[str]], vllm: list[list[str]]) -> bool:
    """The calls alike but where vLLM's arguments are `null` (or nothing) and rolltap's `{}`."""
    if len(mine) != len(vllm) or [n for n, _ in mine] != [n for n, _ in vllm]:
        return False
    odd = [(a, b) for (_, a), (_, b) in zip(mine, vllm, strict=True) if a != b]
    return bool(odd) and all(a == "{}" and b in ("null", "") for a, b in odd)


def settled(answer: parity.Answer) -> parity.Answer:
    """An answer's content as a whole answer settles it beside calls (stripped): vLLM's
    streams, like rolltap's, send the spaces a whole answer drops."""
    if not answer.calls:
        return answer
    return parity.Answer(answer.content.strip(), answer.reasoning, answer.calls)


def _stream_reason(
    suite: parity.Suite,
    text: str,
    read: dict[str, tuple[parity.Answer, parity.Answer]],
    mode: str,
    whole: str | None,
) -> str | None:
    (ours, theirs), (ours_whole, theirs_whole) = read[mode], read["whole"]
    if ours == ours_whole and _null_arguments(
        [list(c) for c in ours.calls], [list(c) for c in theirs.calls]
    ):
        return "null_arguments"
    if theirs != theirs_whole and settled(ours) == settled(theirs_whole):
        return "vllm_stream"
    if mode == "chunks" and ours == read["stream"][1] and ours == read["stream"][0]:
        return "vllm_chunking"
    if settled(ours) == settled(ours_whole):
        if whole is not None:
            return whole
        return "vllm_stream" if settled(theirs) != settled(theirs_whole) else None
    malformed = parity.rolltap_outcome(suite, text).startswith("malformed")
    return "rolltap_stream_break" if malformed else None


Read = dict[str, tuple[parity.Answer, parity.Answer]]
"""Each way (parity.MODES) -> (rolltap's answer, vLLM's)."""


def reasons(suite: parity.Suite, text: str, read: Read) -> dict[str, str | None]:
    """Each way rolltap and vLLM read `text` differently -> the key of the reason that
    explains it (REASONS), None where no rule fits."""
    whole = None
    if read["whole"][0] != read["whole"][1]:
        ours, theirs = (json.loads(a.describe()) for a in read["whole"])
        whole = _whole_reason(suite, text, ours, theirs)
    return {
        mode: whole if mode == "whole" else _stream_reason(suite, text, read, mode, whole)
        for mode in parity.MODES
        if read[mode][0] != read[mode][1]
    }


def triage(name: str) -> tuple[dict[str, dict[str, list[str]]], list[str]]:
    suite = parity.SUITES[name]
    found: dict[str, dict[str, list[str]]] = {}
    unexplained: list[str] = []
    for case in parity.cases(suite.corpus):
        read = {m: parity.compare(suite, case, m) for m in parity.MODES}
        for mode, reason in reasons(suite, case["text"], read).items():
            ours, theirs = read[mode]
            if reason is None:
                unexplained.append(
                    f"{case['id']} {mode}: {case['text']!r}\n  R {ours.describe()}\n"
                    f"  V {theirs.describe()}"
                )
                continue
            found.setdefault(reason, {}).setdefault(case["id"], []).append(mode)
    return found, unexplained


def main(names: list[str]) -> int:
    reason = harmony_vocab.install(Path(tempfile.gettempdir()) / "rolltap-o200k")
    if reason is not None:
        print(f"gpt-oss suites need the o200k vocabulary: {reason}", file=sys.stderr)
    current = json.loads(DIFFERENCES.read_text(encoding="utf-8")) if DIFFERENCES.exists() else {}
    failed = False
    for name in names or sorted(parity.SUITES):
        found, unexplained = triage(name)
        current[name] = [
            {"reason": REASONS[key], "key": key, "cases": cases}
            for key, cases in sorted(found.items())
        ]
        for line in unexplained:
            print(f"UNEXPLAINED {name}: {line}")
            failed = True
    DIFFERENCES.write_text(
        json.dumps(current, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
