"""Incremental detokenization of one sequence, with stop strings matched and held back like vLLM."""

from __future__ import annotations

from typing import Any


class TextStream:
    """Turns sampled ids into released text deltas; stops at the first stop string.

    The released deltas concatenate to `decode(ids, skip_special_tokens)` truncated at the stop
    string (vLLM: `text` stops there while ids keep every sampled token). Text that could still
    grow into a stop string is held back until it cannot, so a stream never shows a stop string.
    """

    def __init__(
        self,
        tokenizer: Any,
        stop: tuple[str, ...] = (),
        include_stop: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._include_stop = include_stop
        self._skip = skip_special_tokens
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        """All text decoded so far (after a stop: truncated at it)."""
        self.released = 0
        """How much of `text` has been handed out."""
        self.stopped: str | None = None

    def push(self, token_id: int) -> str:
        """Add a sampled id; return the text that became safe to release."""
        if self.stopped is not None:
            return ""
        self._ids.append(token_id)
        start = len(self.text)
        self.text += self._decode_new(final=False)
        if self._stop and self._match(start):
            return self._release(len(self.text))
        return self._release(len(self.text) - self._holdback)

    def finish(self) -> str:
        """The sequence ended: release everything, including an incomplete trailing character."""
        if self.stopped is None:
            start = len(self.text)
            self.text += self._decode_new(final=True)
            if self._stop:
                self._match(start)
        return self._release(len(self.text))

    def _decode_new(self, final: bool) -> str:
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        # A trailing U+FFFD is a character whose bytes are still arriving: wait for them.
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return ""
        # The window restarts at a character boundary: the ids just decoded become the context.
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(prefix) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return str(self._tokenizer.decode(ids, skip_special_tokens=self._skip))

    def _match(self, start: int) -> bool:
        """Look for a stop string that could end in the text added after `start`."""
        best: tuple[int, str] | None = None
        for stop in self._stop:
            at = self.text.find(stop, max(0, start - len(stop) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return False
        at, stop = best
        self.stopped = stop
        self.text = self.text[: at + len(stop) if self._include_stop else at]
        return True

    def _release(self, upto: int) -> str:
        upto = max(upto, self.released)
        delta = self.text[self.released : upto]
        self.released = upto
        return delta
