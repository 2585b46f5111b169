#!/bin/bash
# Checks that /app/answer.txt holds the number 42.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -f answer.txt ] || fail "answer.txt is missing"
[ "$(tr -d ' \t\r\n' < answer.txt)" = "42" ] || fail "answer.txt does not hold 42"
pass
