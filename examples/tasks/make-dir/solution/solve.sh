#!/bin/bash
set -euo pipefail
cd /app
mkdir -p output
