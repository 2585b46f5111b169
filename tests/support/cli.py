"""The installed `rolltap` command as a user runs it: a subprocess in a folder of the test's own,
with a data directory (embedded store, run logs) inside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROLLTAP = str(Path(sys.executable).parent / "rolltap")


def rolltap(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # A data directory of the test's own: the embedded default store and run logs land there.
    env = {**os.environ, "XDG_DATA_HOME": str(cwd / "data"), "HOME": str(cwd)}
    env.pop("ROLLTAP_DB", None)
    return subprocess.run(
        [ROLLTAP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
