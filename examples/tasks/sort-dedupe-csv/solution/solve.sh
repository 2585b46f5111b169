#!/bin/bash
set -euo pipefail
cd /app
{ head -n 1 people.csv; tail -n +2 people.csv | sort -u -t, -k1,1 -k2,3; } > people_clean.csv
