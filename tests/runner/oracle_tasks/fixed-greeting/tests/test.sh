#!/bin/bash
# Reward 1 when /app/greeting.txt holds hello.
if [ "$(cat /app/greeting.txt 2>/dev/null)" = hello ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
