"""Egress through the rollout service: a batch asks for it (`egress` in POST /v1/batches), the
server's own egress config says where hosts are, and the batch's rollouts carry their records."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolltap.client import Group
from rolltap.runner.egress import EgressMode, EgressSettings
from rolltap.store import EgressVerdict, Store
from tests.support.egress import ALLOWED_HOST, DENIED_HOST, https_upstream, make_pki, require_gate
from tests.support.proxy import fake_engine
from tests.support.service import running_service

pytestmark = pytest.mark.slow

FETCH = (
    'python3 -c "import urllib.request, urllib.error\n'
    f"for host in ('{ALLOWED_HOST}', '{DENIED_HOST}'):\n"
    "    try: print(urllib.request.urlopen('https://' + host + '/simple/x', timeout=20).status)\n"
    '    except urllib.error.HTTPError as e: print(e.code)" > answer.txt'
)


async def test_a_batch_asking_for_egress_gets_the_servers_gate(
    store: Store, tmp_path: Path
) -> None:
    require_gate()
    pki = make_pki(tmp_path / "pki", (ALLOWED_HOST, DENIED_HOST))
    task = {"id": "fetch", "instruction": "Fetch.", "test": "grep -qx 200 answer.txt"}
    async with https_upstream(pki) as (port, upstream):
        server_side = EgressSettings(
            resolve={ALLOWED_HOST: f"127.0.0.1:{port}", DENIED_HOST: f"127.0.0.1:{port}"},
            upstream_ca=pki.ca,
        )
        async with (
            fake_engine() as engine,
            running_service(
                store, engine.url, logs=tmp_path / "logs", scripts={"fetch": FETCH},
                egress=server_side,
            ) as service,
        ):  # fmt: skip
            batch = await service.client.submit(
                [task],
                harness="fetch",
                egress={"mode": EgressMode.ALLOWLIST.value, "allow": [ALLOWED_HOST]},
            )
            events = [e async for e in service.client.events(batch.id)]

    (group,) = [e for e in events if isinstance(e, Group)]
    (sample,) = group.samples
    assert sample.reward == 1.0
    assert upstream.hits == [f"{ALLOWED_HOST} /simple/x"]
    records = await store.egress(sample.rollout_id)
    assert [(r.host, r.verdict, r.status) for r in records] == [
        (ALLOWED_HOST, EgressVerdict.ALLOWED, 200),
        (DENIED_HOST, EgressVerdict.DENIED, 403),
    ]
    assert batch.data["spec"]["egress"] == {"mode": "allowlist", "allow": [ALLOWED_HOST]}
