#!/bin/bash
# Checks /app/people_clean.csv against the deduplicated, name-sorted rows of the original CSV (kept in /tests).
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -f people_clean.csv ] || fail "people_clean.csv is missing"
python3 - <<'EOF' || fail "people_clean.csv is not right"
lines = open("/tests/people.orig.csv").read().splitlines()
header, rows = lines[0], lines[1:]
expected = [header] + sorted(set(rows), key=lambda r: r.split(",")[0])
got = [l.rstrip("\r") for l in open("/app/people_clean.csv").read().splitlines() if l.strip()]
assert got == expected, (got, expected)
EOF
pass
