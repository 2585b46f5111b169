"""Installs harnesses into isolated prefixes (a venv, an npm prefix) under the harness root.

Layout: `<root>/<name>/` holds the harness (`venv/` or `node_modules/`), `install.log` and, written
last, `rolltap-install.json`; a prefix without that manifest is a broken install. A sandbox
bind-mounts `Installation.mounts` read-only at the same paths. A venv made from a pyenv Python
still needs that Python's tree (its libpython and stdlib), so it is reported as a mount rather
than copied: Debian's own /usr/bin/python3.* needs nothing beyond the read-only root.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

import platformdirs

from .base import BuiltIn, Harness, Installation, NpmPackages, PythonPackages
from .errors import InstallFailed, NotInstalled

MANIFEST = "rolltap-install.json"
IMAGE_ROOT = PurePosixPath("/opt/rolltap/harnesses")
"""Where harness_images/<name>/Dockerfile installs the harness inside an image."""
_HOST_ROOT_DIRS = ("/usr/", "/bin/", "/lib/", "/lib64/", "/sbin/")


def harness_root() -> Path:
    """`$ROLLTAP_HARNESS_DIR`, else `<user data dir>/rolltap/harnesses`."""
    override = os.environ.get("ROLLTAP_HARNESS_DIR")
    if override:
        return Path(override).absolute()
    return platformdirs.user_data_path("rolltap") / "harnesses"


@dataclass(frozen=True)
class InstallRecord:
    """The manifest of one finished install."""

    name: str
    requirements: list[str]
    prefix: str
    bin_dir: str
    mounts: list[str]
    path: list[str]
    seconds: float
    size_bytes: int
    installed_at: float
    interpreter: str = ""
    """The Python (for venvs) or node the harness runs on."""

    def installation(self) -> Installation:
        return Installation(
            name=self.name,
            prefix=PurePosixPath(self.prefix),
            bin_dir=PurePosixPath(self.bin_dir),
            mounts=tuple(PurePosixPath(m) for m in self.mounts),
            path=tuple(self.path),
        )

    def is_current(self, harness: Harness) -> bool:
        return self.requirements == list(harness.packages.requirements)


def read_record(name: str, root: Path) -> InstallRecord | None:
    try:
        data = json.loads((root / name / MANIFEST).read_text())
        return InstallRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def installation(harness: Harness, root: Path | None = None) -> Installation:
    """The host installation of `harness`; raises NotInstalled when missing or outdated."""
    if isinstance(harness.packages, BuiltIn):
        # Part of rolltap: nothing installed, nothing mounted (rollout._mounts skips it).
        return Installation(harness.name, PurePosixPath("/"), PurePosixPath("/"))
    record = read_record(harness.name, root or harness_root())
    if record is None or not record.is_current(harness):
        raise NotInstalled(harness.name)
    return record.installation()


def image_installation(harness: Harness) -> Installation:
    """Where harness_images/<name>/Dockerfile puts the harness inside an image."""
    prefix = IMAGE_ROOT / harness.name
    return Installation(harness.name, prefix, prefix / harness.packages.bin_dir)


def install(
    harness: Harness,
    root: Path | None = None,
    *,
    force: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> InstallRecord:
    """Install `harness` unless an install of the same requirements is already there."""
    if isinstance(harness.packages, BuiltIn):
        raise InstallFailed(f"{harness.name} is part of rolltap: there is nothing to install")
    root = root or harness_root()
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{harness.name}.lock"):
        record = read_record(harness.name, root)
        if record is not None and record.is_current(harness) and not force:
            say(f"{harness.name}: already installed at {record.prefix}")
            return record
        prefix = root / harness.name
        if prefix.exists():
            shutil.rmtree(prefix)
        prefix.mkdir(parents=True)
        started = time.monotonic()
        packages = harness.packages
        if isinstance(packages, PythonPackages):
            mounts, path, interpreter = _install_python(packages, prefix, say)
        else:
            mounts, path, interpreter = _install_npm(packages, prefix, say)
        record = InstallRecord(
            name=harness.name,
            requirements=list(packages.requirements),
            prefix=str(prefix),
            bin_dir=str(prefix / packages.bin_dir),
            mounts=[str(prefix), *mounts],
            path=path,
            seconds=round(time.monotonic() - started, 1),
            size_bytes=tree_size(prefix),
            installed_at=time.time(),
            interpreter=interpreter,
        )
        (prefix / MANIFEST).write_text(json.dumps(asdict(record), indent=2) + "\n")
        return record


def tree_size(path: Path) -> int:
    """Bytes used by the files under `path`, each hard-linked file counted once."""
    seen: set[int] = set()
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def _install_python(
    packages: PythonPackages, prefix: Path, say: Callable[[str], None]
) -> tuple[list[str], list[str], str]:
    python, base_prefix = find_python(packages)
    say(f"venv with {python}")
    venv = prefix / "venv"
    _run([python, "-m", "venv", str(venv)], prefix)
    say(f"pip install {' '.join(packages.requirements)}")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input"]
    _run([*pip, "--disable-pip-version-check", *packages.requirements], prefix)
    mounts = [] if _on_host_root(base_prefix) else [base_prefix]
    return mounts, [], python


def _install_npm(
    packages: NpmPackages, prefix: Path, say: Callable[[str], None]
) -> tuple[list[str], list[str], str]:
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        raise InstallFailed("node and npm must be on PATH to install Node harnesses")
    say(f"npm install {' '.join(packages.requirements)}")
    flags = ["--no-audit", "--no-fund", "--no-update-notifier", "--loglevel=error"]
    _run([npm, "install", "--prefix", str(prefix), *flags, *packages.requirements], prefix)
    node_dir = str(Path(node).resolve().parent)
    mounts = [] if _on_host_root(node_dir) else [node_dir]
    return mounts, [node_dir], str(Path(node).resolve())


def find_python(packages: PythonPackages) -> tuple[str, str]:
    """(interpreter, its base prefix) for a Python that fits `packages`.

    Tries `$ROLLTAP_HARNESS_PYTHON`, then the system's /usr/bin/python3.X (a sandbox's read-only
    root already has it), then `python3.X` on PATH, then pyenv's versions; oldest minor first."""
    low, high = packages.python, packages.python_below or (3, 99)
    minors = [m for m in range(low[1], 20) if (3, m) < high]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [os.environ.get("ROLLTAP_HARNESS_PYTHON", "")]
    candidates += [f"/usr/bin/python3.{m}" for m in minors]
    candidates += [shutil.which(f"python3.{m}") or "" for m in minors]
    for minor in minors:
        candidates += [str(p) for p in sorted(pyenv.glob(f"3.{minor}.*/bin/python3.{minor}"))]
    probe = (
        "import sys, json, venv, ensurepip;"
        "print(json.dumps([*sys.version_info[:2], sys.executable, sys.base_prefix]))"
    )
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        done = subprocess.run([candidate, "-c", probe], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            continue
        major, minor, executable, base = json.loads(done.stdout)
        if low <= (major, minor) < high:
            return executable, base
    wanted = f">={low[0]}.{low[1]}" + (f",<{high[0]}.{high[1]}" if packages.python_below else "")
    raise InstallFailed(
        f"no Python {wanted} with venv and ensurepip found; set ROLLTAP_HARNESS_PYTHON"
    )


def _on_host_root(path: str) -> bool:
    return any(path.rstrip("/") + "/" == d or path.startswith(d) for d in _HOST_ROOT_DIRS)


def _run(argv: list[str], prefix: Path) -> None:
    """Run one install step, its output appended to `<prefix>/install.log`."""
    log = prefix / "install.log"
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise InstallFailed(f"{argv[0]} exited {done.returncode} (log {log}):\n{tail}")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
