#!/bin/bash
set -euo pipefail
cd /app
grep -oiw error server.log | wc -l | tr -d ' ' > answer.txt
