#!/bin/bash
# Checks that /app/count.txt holds the line count of data.txt (137).
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -f count.txt ] || fail "count.txt is missing"
[ "$(tr -d ' \t\r\n' < count.txt)" = "137" ] || fail "count.txt does not hold 137"
pass
