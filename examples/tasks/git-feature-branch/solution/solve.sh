#!/bin/bash
set -euo pipefail
cd /app
git checkout -q -b feature main
echo done > FEATURE.md
git add FEATURE.md
git commit -q -m "Add feature"
