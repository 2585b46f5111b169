#!/bin/bash
# Checks the feature branch's commit (message, parent, FEATURE.md) and that main did not move.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
git rev-parse --verify -q feature >/dev/null || fail "no branch feature"
[ "$(git rev-parse main)" = "$(cat /app/.git/rolltap-main)" ] || fail "main moved"
[ "$(git rev-parse feature~1)" = "$(git rev-parse main)" ] || fail "feature is not one commit on main"
[ "$(git log -1 --format=%s feature)" = "Add feature" ] || fail "wrong commit message"
[ "$(git show feature:FEATURE.md | tr -d ' \t\r\n')" = "done" ] || fail "FEATURE.md is wrong"
pass
