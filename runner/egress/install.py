"""mitmproxy in a venv of its own, for the egress gate.

mitmproxy pins exact versions of libraries (h11, among others) older than what rolltap's other
dependencies need, so it cannot share rolltap's environment: the gate runs on the Python of
`<user data dir>/rolltap/egress/venv` (or `$ROLLTAP_EGRESS_PYTHON`), made by `rolltap egress
install` (and by .ci/install-harnesses).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import platformdirs

from ..harnesses.base import PythonPackages
from ..harnesses.install import find_python
from .errors import EgressUnavailable

MITMPROXY = "mitmproxy==11.0.2"
"""The last release that runs on Python 3.11 (Debian 12's)."""


def egress_root() -> Path:
    return platformdirs.user_data_path("rolltap") / "egress"


def egress_python() -> Path:
    """The interpreter that runs the gate; raises EgressUnavailable when it has no mitmproxy."""
    override = os.environ.get("ROLLTAP_EGRESS_PYTHON")
    python = Path(override) if override else egress_root() / "venv" / "bin" / "python"
    marker = egress_root() / "installed.txt"
    if override:
        return python
    if not python.exists() or not marker.is_file() or marker.read_text().strip() != MITMPROXY:
        raise EgressUnavailable(
            "mitmproxy for the egress gate is not installed: run `rolltap egress install`"
        )
    return python


def install_egress(*, force: bool = False, say: Callable[[str], None] = lambda _: None) -> Path:
    """Creates the venv with mitmproxy (a no-op when it is there); returns its Python."""
    root = egress_root()
    marker = root / "installed.txt"
    if not force and marker.is_file() and marker.read_text().strip() == MITMPROXY:
        say(f"mitmproxy already installed in {root / 'venv'}")
        return root / "venv" / "bin" / "python"
    python, _ = find_python(PythonPackages((MITMPROXY,), python=(3, 10)))
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    say(f"venv with {python}, then pip install {MITMPROXY}")
    log = root / "install.log"
    venv_python = root / "venv" / "bin" / "python"
    for argv in (
        [python, "-m", "venv", str(root / "venv")],
        [str(venv_python), "-m", "pip", "install", "--no-input", "-q", MITMPROXY],
    ):
        with log.open("a") as out:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            raise EgressUnavailable(f"{argv[0]} exited {done.returncode} (log {log}):\n{tail}")
    marker.write_text(MITMPROXY + "\n")
    return venv_python
