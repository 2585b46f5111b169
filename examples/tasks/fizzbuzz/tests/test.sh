#!/bin/bash
# Runs python3 /app/fizzbuzz.py and compares its output with the expected 100 lines.
# Writes 1 to /logs/verifier/reward.txt when that holds, else 0.
pass() { echo 1 > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
cd /app || fail "no /app"
[ -f fizzbuzz.py ] || fail "fizzbuzz.py is missing"
out=$(timeout 10 python3 fizzbuzz.py) || fail "fizzbuzz.py failed"
expected=$(python3 -c '
for i in range(1, 101):
    print("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else i)')
[ "$out" = "$expected" ] || fail "wrong output"
pass
