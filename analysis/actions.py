"""What an agent did, read from its rollout's recorded calls in every dialect: each tool call the
model made (a shell command, a file read or write, a fetch) with the tool results the harness sent
back for it, and the call that first carried it.

One reading for Chat Completions, Responses and Anthropic Messages: the bodies are reduced to
`ConversationTurn`s by analysis/turns.py, then each tool call is interpreted by what its arguments
hold, not by the harness that defined the tool: a `command`/`cmd` is a shell command
(mini-swe-agent's `bash`, Codex's `exec_command` and `shell`, Claude Code's `Bash`, OpenHands'
`execute_bash`, Qwen Code's `run_shell_command`), a path with new content is a write and a path
alone a read (`Read`, `Write`, `Edit`, `str_replace_editor`, `read_file`...), a `url` is a fetch,
and Codex's `apply_patch` writes the files its patch names. Harnesses that send commands as text
(mini-swe-agent's text mode) have them read from the fenced shell blocks of assistant messages.

A call's request repeats the conversation so far, so the same action is seen many times: it is
kept once, attributed to the first call that carried it (the call whose answer the model made
it in; for a call answered by nobody, the first request that holds it). A tool result is paired
with its tool call by position, as every dialect orders them.
"""

from __future__ import annotations

import enum
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..store.models import CallDialect, CallStatus
from .turns import ConversationTurn, ToolCall, request_turns, response_turns


class ActionKind(enum.StrEnum):
    SHELL = "shell"
    """`target` is a shell command (or a script's code)."""
    READ = "read"
    """`target` is a path the tool read (or listed, or searched)."""
    WRITE = "write"
    """`target` is a path the tool wrote, edited or removed."""
    FETCH = "fetch"
    """`target` is a URL the tool fetched."""
    OTHER = "other"
    """`target` is the tool's arguments as sent."""


@dataclass(frozen=True)
class RecordedCall:
    """One recorded call, as detectors read it: its place, outcome and bodies."""

    id: str
    seq: int
    dialect: CallDialect
    status: CallStatus
    received_at: datetime
    finished_at: datetime | None = None
    request: bytes | None = None
    response: bytes | None = None


@dataclass(frozen=True)
class Action:
    call_id: str
    """The first call that carried it (see the module docstring)."""
    seq: int
    tool: str
    """The tool's name, or `text` for a command fenced in an assistant message."""
    kind: ActionKind
    target: str
    results: tuple[str, ...] = ()
    """The tool results the harness sent back for it, distinct, in the order first seen."""
    result_call_id: str | None = None
    """The first call whose request carried a result of it."""
    result_seq: int | None = None
    index: int = field(default=0, compare=False)
    """Its position among the rollout's actions, from 0."""


_SHELL_KEYS = ("command", "cmd", "script", "commands", "code", "shell_command")
_PATH_KEYS = (
    "file_path",
    "filePath",
    "path",
    "absolute_path",
    "notebook_path",
    "file",
    "filename",
    "target_file",
    "dir_path",
    "directory",
)
_CONTENT_KEYS = ("content", "new_string", "old_string", "new_str", "old_str", "edits", "text")
_WRITE_WORDS = ("write", "edit", "create", "replace", "insert", "patch", "delete", "remove", "move")
_EDITOR_COMMANDS = {"view": False, "create": True, "str_replace": True, "insert": True}
_FENCE = re.compile(
    r"```[ \t]*(bash|sh|shell|zsh|console|terminal|mswea_bash_command|bash-session)[ \t]*\n"
    r"(.*?)```",
    re.DOTALL | re.IGNORECASE,
)
_PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+)$", re.MULTILINE)
_PATCH_MOVE = re.compile(r"^\*\*\* Move to: (.+)$", re.MULTILINE)
RESULT_LIMIT = 64_000
"""Characters of each tool result kept for detectors (outputs can be megabytes)."""


def read_actions(calls: Sequence[RecordedCall]) -> list[Action]:
    """Every distinct action of the rollout, in the order first seen (calls in seq order)."""
    found: dict[tuple[str, ActionKind, str], _Found] = {}
    for call in sorted(calls, key=lambda c: c.seq):
        for key, tool, result in _from_conversation(
            request_turns(call.dialect, call.request) or []
        ):
            entry = found.get(key)
            if entry is None:
                entry = found[key] = _Found(call.id, call.seq, tool)
            if result is not None:
                entry.add_result(result, call)
        for key, tool, _ in _from_conversation(response_turns(call.dialect, call.response) or []):
            found.setdefault(key, _Found(call.id, call.seq, tool))
    return [
        Action(
            call_id=e.call_id,
            seq=e.seq,
            tool=e.tool,
            kind=kind,
            target=target,
            results=tuple(e.results),
            result_call_id=e.result_call_id,
            result_seq=e.result_seq,
            index=i,
        )
        for i, ((_, kind, target), e) in enumerate(found.items())
    ]


def interpret(name: str, arguments: str) -> list[tuple[ActionKind, str]]:
    """What one tool call does: (kind, target) for each thing it touches (a patch may write
    several files)."""
    lowered = name.lower()
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        args = arguments
    if isinstance(args, str):
        if "apply_patch" in lowered or args.lstrip().startswith("*** Begin Patch"):
            return _patch_targets(args)
        if _shell_name(lowered):
            return [(ActionKind.SHELL, args)]
        return [(ActionKind.OTHER, args)] if args else []
    if not isinstance(args, dict):
        return [(ActionKind.OTHER, arguments)] if arguments else []
    if "apply_patch" in lowered:
        patch = args.get("input") or args.get("patch")
        if isinstance(patch, str):
            return _patch_targets(patch)
    path = next((args[k] for k in _PATH_KEYS if isinstance(args.get(k), str) and args[k]), None)
    editor = args.get("command")
    if path is not None and isinstance(editor, str) and editor in _EDITOR_COMMANDS:
        kind = ActionKind.WRITE if _EDITOR_COMMANDS[editor] else ActionKind.READ
        return [(kind, path)]
    for key in _SHELL_KEYS:
        command = _command_text(args.get(key))
        if command:
            return [(ActionKind.SHELL, command)]
    url = args.get("url") or args.get("uri")
    if isinstance(url, str) and url:
        return [(ActionKind.FETCH, url)]
    if path is not None:
        writes = any(w in lowered for w in _WRITE_WORDS) or any(k in args for k in _CONTENT_KEYS)
        return [(ActionKind.WRITE if writes else ActionKind.READ, path)]
    return [(ActionKind.OTHER, arguments)] if arguments else []


def fenced_commands(text: str) -> list[str]:
    """The shell blocks of an assistant message (harnesses that take commands as text)."""
    return [m.group(2).strip() for m in _FENCE.finditer(text) if m.group(2).strip()]


@dataclass
class _Found:
    call_id: str
    seq: int
    tool: str
    results: list[str] = field(default_factory=list)
    result_call_id: str | None = None
    result_seq: int | None = None

    def add_result(self, result: str, call: RecordedCall) -> None:
        if self.result_call_id is None:
            self.result_call_id, self.result_seq = call.id, call.seq
        kept = result[:RESULT_LIMIT]
        if kept not in self.results:
            self.results.append(kept)


_Key = tuple[str, ActionKind, str]


def _from_conversation(turns: Sequence[ConversationTurn]) -> Iterator[tuple[_Key, str, str | None]]:
    """(key, tool, its result or None) for every action of a conversation, results paired by
    position: the tool turns after an assistant turn answer its calls in order; a user turn
    after a text command is its output."""
    i = 0
    while i < len(turns):
        turn = turns[i]
        i += 1
        if turn.role != "assistant":
            continue
        made = _made_by(turn)
        if not made:
            continue
        if turn.tool_calls:
            results: list[str | None] = []
            while i < len(turns) and turns[i].role == "tool":
                results.append(turns[i].text)
                i += 1
        else:
            follows = i < len(turns) and turns[i].role in ("user", "tool")
            results = [turns[i].text] if follows else []
        for n, (keys, tool) in enumerate(made):
            result = results[n] if n < len(results) else None
            for key in keys:
                yield key, tool, result


def _made_by(turn: ConversationTurn) -> list[tuple[list[_Key], str]]:
    """Each tool call of an assistant turn with its keys, or its fenced commands (one each)."""
    if turn.tool_calls:
        return [(_keys(call), call.name) for call in turn.tool_calls]
    return [([("text", ActionKind.SHELL, c)], "text") for c in fenced_commands(turn.text)]


def _keys(call: ToolCall) -> list[_Key]:
    return [(call.name, kind, target) for kind, target in interpret(call.name, call.arguments)]


def _command_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        # Codex's `shell` sends argv: ["bash", "-lc", "the script"].
        if len(value) == 3 and value[1] in ("-c", "-lc", "-ic") and "sh" in value[0]:
            return str(value[2])
        return shlex.join(value)
    return None


def _shell_name(lowered: str) -> bool:
    return any(w in lowered for w in ("bash", "shell", "exec", "terminal", "command", "run"))


def _patch_targets(patch: str) -> list[tuple[ActionKind, str]]:
    paths = [p.strip() for p in _PATCH_FILE.findall(patch) + _PATCH_MOVE.findall(patch)]
    return [(ActionKind.WRITE, p) for p in dict.fromkeys(paths) if p]
