#!/bin/bash
# Checks that /app/output is a directory.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -d output ] || fail "output is not a directory"
pass
