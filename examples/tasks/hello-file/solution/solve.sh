#!/bin/bash
set -euo pipefail
cd /app
echo hello > hello.txt
