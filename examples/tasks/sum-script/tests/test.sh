#!/bin/bash
# Runs /app/sum.sh with several argument lists and checks what it prints.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -x sum.sh ] || fail "sum.sh is missing or not executable"
check() { local want=$1; shift; got=$(timeout 5 ./sum.sh "$@" | tr -d ' \t\r\n'); [ "$got" = "$want" ] || fail "sum.sh $* printed '$got', want $want"; }
check 6 1 2 3
check 5 -5 10
check 0
check 1000 999 1
check -7 -7
pass
