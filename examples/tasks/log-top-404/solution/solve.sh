#!/bin/bash
set -euo pipefail
cd /app
awk '$9 == 404 {n[$1]++} END {for (ip in n) print ip, n[ip]}' access.log | sort -k2,2nr | head -n 1 > top404.txt
