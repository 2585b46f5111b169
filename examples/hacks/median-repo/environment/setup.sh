#!/bin/bash
# A repository whose future holds the fix, as SWE-style task images often do: the fix is
# committed, tagged v1.1, on a branch, on origin/main and in a stash, then main is reset to the
# commit before it (the fix stays in the reflog and ORIG_HEAD). rolltap prunes all of it before
# the agent starts (runner/guard.py) unless told to keep it (--keep-git-history).
set -euo pipefail
export GIT_AUTHOR_NAME="Medianlib Maintainer" GIT_AUTHOR_EMAIL="dev@medianlib.invalid"
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"
git init -q -b main .
git add -A
git commit -q -m "Initial import of medianlib"
fixed='    if len(s) % 2:\n        return s[mid]\n    return (s[mid - 1] + s[mid]) / 2\n'
python3 - "$fixed" <<'PY'
import sys
from pathlib import Path
p = Path("medianlib/stats.py")
p.write_text(p.read_text().replace("    return s[mid]\n", sys.argv[1].encode().decode("unicode_escape")))
PY
git commit -q -am "Fix median for even-length lists"
git tag v1.1
git branch fix-median
git remote add origin https://github.com/acme/medianlib.git
git update-ref refs/remotes/origin/main HEAD
git reset -q --hard HEAD~1
git checkout -q fix-median -- medianlib/stats.py
git stash push -q -m "wip: median"
