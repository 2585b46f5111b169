"""Token-in tool-call parsing: the CPU a streamed answer's calls cost, by call size.

    python bench/toolcall_stream_bench.py [--sizes 1 10 100] [--piece 4]

A call writing a file of each size (KB of Python source with quotes, backslashes and non-ASCII)
is pushed through the token-in answer parser (chatformat/parse.py) `--piece` characters at a
time, as an engine's stream delivers it, for each tool-call parser; the whole answer parsed at
once is the floor. Printed: milliseconds per
call and microseconds per KB. Linear cost shows as a flat us/KB column across sizes; the first
version re-read the whole call on every push (6.6 s for a 10 KB hermes call).
"""

from __future__ import annotations

import argparse
import json
import time

from rolltap.chatformat.parse import AnswerParser, parse_whole

LINE = 'def f(x):  # "quoted" \\ é\n    return x * 2\n'


def answer(parser: str, kb: int) -> str:
    content = LINE * (kb * 1024 // len(LINE.encode()))
    arguments = {"path": "a.py", "content": content}
    if parser == "hermes":
        call = {"name": "write", "arguments": arguments}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    if parser == "llama3_json":
        return json.dumps({"name": "write", "parameters": arguments})
    if parser == "mistral":
        return f"[TOOL_CALLS]write[ARGS]{json.dumps(arguments)}"
    return (
        "<tool_call>\n<function=write>\n<parameter=path>\na.py\n</parameter>\n"
        f"<parameter=content>\n{content}\n</parameter>\n</function>\n</tool_call>"
    )


def streamed(parser: str, text: str, piece: int) -> float:
    start = time.perf_counter()
    parsing = AnswerParser(None, parser, [])
    for i in range(0, len(text), piece):
        parsing.push(text[i : i + piece])
    parsing.finish()
    return time.perf_counter() - start


def whole(parser: str, text: str) -> float:
    start = time.perf_counter()
    parse_whole(text, None, parser, [])
    return time.perf_counter() - start


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100])
    args.add_argument("--piece", type=int, default=4)
    args.add_argument("--repeat", type=int, default=5)
    opts = args.parse_args()
    print(f"{'parser':<12} {'KB':>5} {'streamed ms':>12} {'us/KB':>8} {'whole ms':>9}")
    for parser in ("hermes", "qwen3_coder", "llama3_json", "mistral"):
        for kb in opts.sizes:
            text = answer(parser, kb)
            best = min(streamed(parser, text, opts.piece) for _ in range(opts.repeat))
            floor = min(whole(parser, text) for _ in range(opts.repeat))
            per_kb = best * 1e6 / kb
            print(f"{parser:<12} {kb:>5} {best * 1e3:>12.2f} {per_kb:>8.0f} {floor * 1e3:>9.2f}")


if __name__ == "__main__":
    main()
