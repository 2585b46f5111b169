"""A trainer that imports the client loads none of rolltap's store or server: no SQLAlchemy, no
alembic, no proxy, and no aiohttp until it makes a request (a fresh interpreter, as the trainer's
process is)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_client_loads_no_store() -> None:
    probe = (
        "import json, sys; import rolltap.client; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('rolltap', 'sqlalchemy', 'alembic', 'aiosqlite', 'asyncpg', 'aiohttp'))))"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], check=True,
                                       capture_output=True, text=True).stdout)  # fmt: skip

    assert not [m for m in loaded if not m.startswith("rolltap")], loaded
    assert set(loaded) <= {"rolltap", "rolltap.client", "rolltap.loop_thread", "rolltap.wire"}
