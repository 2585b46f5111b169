#!/bin/bash
# Uses a helper beside it and the [solution] env: both must reach the sandbox.
set -euo pipefail
bash "$(dirname "$0")/write.sh" "$GREETING"
