"""`rolltap serve` with its store commit swapped for a plain local journal: a measurement only.

    python bench/journal_serve.py serve --backend URL --db sqlite:///PATH --port PORT

scale_bench.py runs it beside the real `rolltap serve` to split rolltap's added latency at one
client into the record (staging, hash chain, SQLite transaction on the writer thread, and the
hand-off there and back) and everything else. Each call's record is still built and validated
on the proxy's loop as always, then appended, as one line of JSON with its ids, to a file that
is never fsynced (the real store does not fsync either: SQLite WAL at synchronous=normal); the
call gets its receipt at once, so the last byte still follows its record's write. Rollouts,
budgets and everything else use the real store. Not part of rolltap.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import IO

import orjson

from rolltap.cli.main import main
from rolltap.store.records import CallReceipt, CallRecord
from rolltap.store.store import Store, _validated


class Journal:
    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._seqs: defaultdict[str, itertools.count[int]] = defaultdict(lambda: itertools.count(1))

    async def append_call(self, _store: Store, record: CallRecord) -> CallReceipt:
        record = _validated(record)
        assert record.call_id is not None
        line = {
            "rollout": record.rollout_id,
            "call": record.call_id,
            "prompt": None if record.prompt_ids is None else record.prompt_ids.tobytes().hex(),
            "choices": [c.token_ids.tobytes().hex() for c in record.choices],
            "logprobs": [
                None if c.logprobs is None else c.logprobs.tobytes().hex() for c in record.choices
            ],
            "request": (record.request_body or b"").decode(errors="replace"),
            "response": (record.response_body or b"").decode(errors="replace"),
        }
        self._out.write(orjson.dumps(line) + b"\n")
        self._out.flush()
        return CallReceipt(record.call_id, next(self._seqs[record.rollout_id]))


if __name__ == "__main__":
    journal = Journal(open(Path(tempfile.mkdtemp()) / "journal.jsonl", "ab"))  # noqa: SIM115
    Store.append_call = lambda self, record: journal.append_call(self, record)  # type: ignore[method-assign]
    sys.argv = ["rolltap", *sys.argv[1:]]
    main()
