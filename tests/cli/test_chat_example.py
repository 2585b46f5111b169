"""examples/chat.py run before `rolltap serve` is up, as a new user does (issue #35): one line
that says what to start, not a urllib traceback."""

from __future__ import annotations

import subprocess
import sys

from tests.cli.test_mistakes import one_line_error
from tests.support.processes import ROOT, free_port


def test_chat_example_with_no_proxy_is_one_line() -> None:
    proxy = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "chat.py"), "--proxy", proxy],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout == ""
    line = one_line_error(result)
    # The errno in between is the platform's (111 on Linux, 61 on macOS).
    assert line.startswith(f"no rolltap proxy at {proxy} ([Errno "), line
    assert line.endswith("Connection refused): start one with `rolltap serve`"), line
