#!/bin/bash
set -euo pipefail
cd /app
echo 42 > answer.txt
