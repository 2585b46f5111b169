#!/bin/bash
# Checks that /app/top404.txt holds '10.0.3.75 33'.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -f top404.txt ] || fail "top404.txt is missing"
[ "$(tr -s ' \t' ' ' < top404.txt | tr -d '\r\n' | sed 's/^ //; s/ $//')" = "10.0.3.75 33" ] || fail "top404.txt is wrong"
pass
