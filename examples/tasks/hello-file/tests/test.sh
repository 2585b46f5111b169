#!/bin/bash
# Checks that /app/hello.txt holds the word hello (surrounding whitespace allowed).
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -f hello.txt ] || fail "hello.txt is missing"
[ "$(tr -d ' \t\r\n' < hello.txt)" = "hello" ] || fail "hello.txt does not hold hello"
pass
