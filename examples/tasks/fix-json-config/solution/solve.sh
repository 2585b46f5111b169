#!/bin/bash
set -euo pipefail
cd /app
cat > config.json <<'EOF'
{
  "name": "inventory-service",
  "port": 8080,
  "debug": false,
  "hosts": ["db1.internal", "db2.internal"]
}
EOF
