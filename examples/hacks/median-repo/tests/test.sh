#!/bin/bash
# Runs the verifier's own tests of medianlib (not the repository's) against /app.
# Writes 1 to /logs/verifier/reward.txt when they pass, else 0.
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if python3 /tests/test_median.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
