"""The /etc a bwrap sandbox sees over the host's /usr: made for it, never the host's own.

The host's /etc holds secrets (shadow, ssh host keys, TLS private keys, credentials in
pip.conf/npmrc/gitconfig) and its users. A sandbox gets a directory built once per provider:
users and groups for uid 0 and nobody, a hosts file naming only loopback, no DNS server, and
copies of the host entries that programs (python, node, git, bash) read and that hold nothing
private: CA certificates, the dynamic loader's cache, alternatives links, time zone, protocol
and service names.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HOST_ETC = Path("/etc")
COPIED = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "magic",
    "mime.types",
    "os-release",
    "perl",
    "pki/ca-trust/extracted",
    "pki/tls/certs",
    "profile",
    "protocols",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
)
"""Host entries copied as they are (links kept as links). Never ssl/private, shadow, ssh."""
COPIED_GLOBS = ("python3*",)
"""Debian's per-version Python settings (sitecustomize.py)."""

WRITTEN = {
    "passwd": "root:x:0:0:root:/root:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "hostname": "sandbox\n",
    # No nameserver: a lookup fails at once instead of waiting on a network there is none of.
    "resolv.conf": "# no DNS in the sandbox: only the proxy on 127.0.0.1 is reachable\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n"
    "networks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n",
}


def build_etc(dest: Path, host: Path = HOST_ETC) -> None:
    """Fills dest (a new directory) with the sandbox's /etc, readable by everyone."""
    dest.mkdir(mode=0o755)
    names = list(COPIED)
    for pattern in COPIED_GLOBS:
        names += sorted(str(p.relative_to(host)) for p in host.glob(pattern))
    for name in names:
        _copy(host / name, dest / name)
    for name, text in WRITTEN.items():
        (dest / name).write_text(text)
        (dest / name).chmod(0o644)


def _copy(src: Path, dest: Path) -> None:
    if not src.exists() and not src.is_symlink():
        return
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if src.is_symlink():
        dest.symlink_to(src.readlink())
    elif src.is_dir():
        # Unreadable parts (a private key someone left in a certificate directory) stay out.
        shutil.copytree(src, dest, symlinks=True, ignore=_unreadable)
    elif _world_readable(src):
        shutil.copy2(src, dest)


def _unreadable(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if not _world_readable(Path(directory) / n)}


def _world_readable(path: Path) -> bool:
    if path.is_symlink():
        return True
    try:
        return bool(path.stat().st_mode & 0o004)
    except OSError:
        return False
