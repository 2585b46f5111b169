#!/bin/bash
# Checks stats.median and stats.mean on odd, even and unsorted inputs.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
python3 - <<'EOF' || fail "stats.py is still wrong"
import sys
sys.path.insert(0, "/app")
from stats import mean, median
assert median([1, 2, 3, 4]) == 2.5
assert median([3, 1, 2]) == 2
assert median([7]) == 7
assert median([10, 2, 8, 4]) == 6
assert median([5, 1, 4, 2, 3, 6]) == 3.5
assert mean([1, 2, 3, 4]) == 2.5
EOF
pass
