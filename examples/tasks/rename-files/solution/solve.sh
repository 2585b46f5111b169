#!/bin/bash
set -euo pipefail
cd /app
for f in photos/*.jpeg; do mv "$f" "${f%.jpeg}.jpg"; done
