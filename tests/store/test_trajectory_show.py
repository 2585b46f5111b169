"""`rolltap show ROLLOUT`: the segments and the breaks, for a person at a terminal."""

from __future__ import annotations

from click.testing import CliRunner

import rolltap.store
from rolltap.cli.inspect import show
from rolltap.store import NewRollout
from tests.support.chats import QWEN3_STYLE, Recorder, Renderer, smollm2_gguf, smollm2_tokenizer


def test_show_lists_segments_and_breaks(db_url: str) -> None:
    renderer = Renderer(smollm2_tokenizer(), QWEN3_STYLE)
    with rolltap.store.open(db_url) as reader:
        rid = reader.run(reader.store.create_rollout(NewRollout())).id
        rec = Recorder(reader.store, rid, renderer)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
        answer = {"content": "4.", "reasoning_content": "Easy."}
        sampled = renderer.ids("<think>\nEasy.\n</think>\n\n4.<|im_end|>")
        reader.run(rec.call(messages, (sampled, answer)))
        title = [{"role": "system", "content": "Title it."}, {"role": "user", "content": "2+2?"}]
        reader.run(rec.call(title, rec.answer("Sums"), purpose="title"))
        messages += [{"role": "assistant", **answer}, {"role": "user", "content": "3+3?"}]
        reply = rec.answer("6.")
        reader.run(rec.call(messages, reply))
        messages += [{"role": "assistant", **reply[1]}, {"role": "user", "content": "ok"}]
        reader.run(rec.call(messages, rec.answer("Bye.")))

    plain = CliRunner().invoke(show, ["--db", db_url, rid])
    gguf = str(smollm2_gguf())
    with_text = CliRunner().invoke(show, ["--db", db_url, rid, "--tokenizer", gguf])

    assert plain.exit_code == 0, plain.output
    out = plain.output
    assert "faithfulness" in out
    assert "breaks: reasoning_stripped 1" in out
    assert "side calls 1" in out
    assert "break #2: reasoning_stripped at token" in out
    assert "(tokens)" in out
    assert "▓" in out  # the stripped answer's tokens, lost to the later context
    assert with_text.exit_code == 0, with_text.output
    assert "(text): the template left the sampled reasoning out" in with_text.output
    assert "was: '<think>\\nEasy.\\n</think>\\n\\n4.<|im_end|>'" in with_text.output
