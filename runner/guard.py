"""Prevention at provisioning: what the agent must not find in its workspace is removed before
its harness starts, and what the hack detectors need to know of the task is recorded with the
rollout (meta["audit"], read by analysis/hacks.py).

A task whose workdir is in a git repository keeps only what its base commit can see: HEAD and
the branch it is on. Other branches, tags, remotes and their refs, notes, replace refs, stashes,
reflogs, ORIG_HEAD and the like go, and so do the objects nothing left reaches (packed or loose:
`git gc --prune=now` after alternates are repacked in and .keep files dropped). The commits
that were beyond HEAD are listed first (capped at HIDDEN_CAP), so that a detector can still
recognise one the agent names or is shown; the prune is then checked: any of them still in the
object store fails the rollout's setup rather than let the agent find it. On by default; a
task turns it off with `[environment] prune_git_history = false`, a run with
`rolltap run --keep-git-history`.

The survey is a POSIX shell script run as root in the sandbox (every kind has `sh`; git only
where the task has it) with `safe.directory=*`, since the repository's owner may be anyone.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .sandboxes.base import Sandbox
from .sandboxes.errors import SetupFailed
from .tasks import Task


class HistoryNotPruned(Exception):
    """The prune failed, or left a commit beyond HEAD: the rollout fails before its agent
    starts (a deterministic failure of the task, not retried)."""


HIDDEN_CAP = 2000
"""Commit ids beyond HEAD recorded per rollout (the detectors match any of them)."""
SURVEY_TIMEOUT_SEC = 600.0
ROOT = "0"
VERIFIER_PATHS = ("/tests", "/logs/verifier")
"""Where the verifier's tests and reward files live in every sandbox (runner/verify.py)."""

# $1: 1 to prune, $2: how many hidden commit ids to print. One "key value" line per fact.
SURVEY = r"""
set -u
prune=$1 cap=$2
say() { printf '%s %s\n' "$1" "$2"; }
for f in */__init__.py src/*/__init__.py; do
  [ -f "$f" ] && say package "$(basename "$(dirname "$f")")"
done
if [ -f pyproject.toml ]; then
  awk '/^\[project\]/{p=1;next} /^\[/{p=0} p && /^name *=/{gsub(/^name *= *|["'\'' ]/,"");print}' \
    pyproject.toml | while read -r n; do say package "$n"; done
fi
command -v git >/dev/null 2>&1 || exit 0
g() { git -c safe.directory='*' "$@"; }
top=$(g rev-parse --show-toplevel 2>/dev/null) || exit 0
cd "$top" || exit 0
gitdir=$(g rev-parse --absolute-git-dir) || exit 0
say top "$top"
head=$(g rev-parse -q --verify HEAD) || { say error "HEAD names no commit"; exit 0; }
say head "$head"
branch=$(g symbolic-ref -q HEAD) && say branch "$branch"
branch=${branch:-none}
g for-each-ref --format='%(refname)' | while read -r r; do
  [ "$r" = "$branch" ] || say ref "$r"
done
for r in $(g remote); do
  g remote get-url --all "$r" | while read -r u; do say remote "$u"; done
done
beyond() {
  g rev-list --all --reflog --not HEAD 2>/dev/null
  g fsck --unreachable --no-reflogs --no-progress 2>/dev/null | awk '$2 == "commit" {print $3}'
}
hidden=$(beyond | awk '!seen[$0]++')
say hidden_count "$(printf '%s\n' "$hidden" | grep -c .)"
printf '%s\n' "$hidden" | grep . | head -n "$cap" | while read -r c; do say hidden "$c"; done
[ "$prune" = 1 ] || exit 0
g for-each-ref --format='%(refname)' | while read -r r; do
  [ "$r" = "$branch" ] || g update-ref -d "$r" || say error "cannot delete $r"
done
for r in $(g remote); do g remote remove "$r" >/dev/null 2>&1; done
g worktree prune >/dev/null 2>&1
rm -rf "$gitdir/logs" "$gitdir/refs/original" "$gitdir/rr-cache" "$gitdir/worktrees" \
  "$gitdir/ORIG_HEAD" "$gitdir/FETCH_HEAD" "$gitdir/MERGE_HEAD" "$gitdir/CHERRY_PICK_HEAD" \
  "$gitdir/REBASE_HEAD" "$gitdir/MERGE_MSG" "$gitdir/SQUASH_MSG" "$gitdir/COMMIT_EDITMSG" \
  "$gitdir/sequencer"
find "$gitdir/objects/pack" -name '*.keep' -exec rm -f {} + 2>/dev/null
if [ -s "$gitdir/objects/info/alternates" ]; then
  g repack -a -d -q && rm -f "$gitdir/objects/info/alternates"
fi
g -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now -c gc.pruneExpire=now \
  -c gc.worktreePruneExpire=now -c gc.rerereResolved=now -c gc.rerereUnresolved=now \
  gc --prune=now --quiet || say error "git gc failed"
say pruned 1
{ beyond; printf '%s\n' "$hidden" | grep . | while read -r c; do
    g cat-file -e "$c^{commit}" 2>/dev/null && echo "$c"; done; } |
  awk '!seen[$0]++' | while read -r c; do say left "$c"; done
exit 0
"""


@dataclass(frozen=True)
class GitSurvey:
    top: str
    head: str
    branch: str | None
    hidden: tuple[str, ...] = ()
    hidden_count: int = 0
    refs: tuple[str, ...] = ()
    remotes: tuple[str, ...] = ()
    pruned: bool = False
    left: tuple[str, ...] = ()
    """Hidden commits still in the object store after the prune: a failed prevention."""


@dataclass(frozen=True)
class Survey:
    packages: tuple[str, ...] = ()
    git: GitSurvey | None = None
    errors: tuple[str, ...] = field(default=())


def parse_survey(output: str) -> Survey:
    facts: dict[str, list[str]] = {}
    for line in output.splitlines():
        key, _, value = line.partition(" ")
        if key and value:
            facts.setdefault(key, []).append(value.strip())

    def one(key: str) -> str | None:
        return facts.get(key, [None])[0]

    git = None
    head = one("head")
    if head is not None:
        git = GitSurvey(
            top=one("top") or "",
            head=head,
            branch=one("branch"),
            hidden=tuple(facts.get("hidden", [])),
            hidden_count=int(one("hidden_count") or 0),
            refs=tuple(facts.get("ref", [])),
            remotes=tuple(facts.get("remote", [])),
            pruned=one("pruned") == "1",
            left=tuple(facts.get("left", [])),
        )
    packages = tuple(dict.fromkeys(p for p in facts.get("package", []) if p != "tests"))
    return Survey(packages, git, tuple(facts.get("error", [])))


async def guard_workspace(
    sandbox: Sandbox, task: Task, *, prune: bool = True, log: Path | None = None
) -> dict[str, Any]:
    """Surveys the provisioned workspace, prunes its git history (when `prune` and the task
    allow it), and returns the facts to record as meta["audit"]. HistoryNotPruned when the
    prune failed or left a commit beyond HEAD in the repository."""
    pruning = prune and task.environment.prune_git_history
    result = await sandbox.exec(
        ["sh", "-c", SURVEY, "rolltap-guard", "1" if pruning else "0", str(HIDDEN_CAP)],
        timeout=SURVEY_TIMEOUT_SEC,
        user=ROOT,
        log=log,
        proxy=False,
    )
    if result.timed_out:
        raise SetupFailed(f"{task.id}: the git history prune ran past {SURVEY_TIMEOUT_SEC:g} s")
    survey = parse_survey(result.stdout)
    if survey.git is not None and survey.git.left:
        left = ", ".join(c[:12] for c in survey.git.left[:5])
        raise HistoryNotPruned(f"{task.id}: commits beyond HEAD survived the git prune: {left}")
    if pruning and survey.git is not None and survey.errors:
        raise HistoryNotPruned(f"{task.id}: the git history prune failed: {survey.errors[0]}")
    return audit_facts(task, survey)


def audit_facts(task: Task, survey: Survey) -> dict[str, Any]:
    """meta["audit"]: what store/hacks.TaskFacts reads."""
    audit = task.audit
    protected = [*VERIFIER_PATHS, *(_absolute(p, task.workdir) for p in audit.protected_paths)]
    facts: dict[str, Any] = {
        "workdir": task.workdir,
        "protected": list(dict.fromkeys(protected)),
        "upstream": list(audit.upstream),
        "packages": list(dict.fromkeys([*audit.packages, *survey.packages])),
        "agent_timeout": task.agent_timeout_sec,
    }
    git = survey.git
    if git is not None:
        facts["git"] = {
            "top": git.top,
            "head": git.head,
            "branch": git.branch,
            "hidden": list(git.hidden),
            "hidden_count": git.hidden_count,
            "hidden_refs": list(git.refs),
            "remotes": list(git.remotes),
            "pruned": git.pruned,
        }
    return facts


def _absolute(path: str, workdir: str) -> str:
    return posixpath.normpath(posixpath.join(workdir, path))


def describe(facts: Mapping[str, Any]) -> str | None:
    """One line for the setup log: what the prune removed, or None without a repository."""
    git = facts.get("git")
    if not isinstance(git, dict):
        return None
    count = git.get("hidden_count", 0)
    refs = len(git.get("hidden_refs") or [])
    done = "removed" if git.get("pruned") else "kept (prune off)"
    return f"git history beyond HEAD: {count} commits, {refs} refs {done}"


__all__ = [
    "GitSurvey",
    "HistoryNotPruned",
    "Survey",
    "audit_facts",
    "describe",
    "guard_workspace",
    "parse_survey",
]
