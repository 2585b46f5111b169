#!/bin/bash
set -euo pipefail
cd /app
cat > sum.sh <<'EOF'
#!/bin/bash
total=0
for n in "$@"; do total=$((total + n)); done
echo "$total"
EOF
chmod +x sum.sh
