#!/bin/bash
# Checks that /app/config.json parses and holds the original settings with port 8080.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
python3 - <<'EOF' || fail "config.json is not right"
import json
c = json.load(open("/app/config.json"))
assert c == {"name": "inventory-service", "port": 8080, "debug": False,
             "hosts": ["db1.internal", "db2.internal"]}, c
EOF
pass
