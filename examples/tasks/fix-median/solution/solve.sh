#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'EOF'
from pathlib import Path
p = Path("stats.py")
p.write_text(p.read_text().replace("    return s[mid]\n", "    if len(s) % 2:\n        return s[mid]\n    return (s[mid - 1] + s[mid]) / 2\n"))
EOF
