#!/bin/bash
# A broken verifier, on purpose: data.txt has 3 lines, and this expects 4. No solution can pass,
# and the oracle must say so.
if [ "$(tr -d ' ' < /app/count.txt)" = 4 ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
