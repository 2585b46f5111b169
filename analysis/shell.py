"""Shell commands as detectors read them: a script split into simple commands (argv lists), best
effort and without running or expanding anything.

Separators (`;`, `&&`, `||`, `|`, `&`, newlines, subshell parentheses) end a command; `$(...)` and
backticks are read as scripts of their own; `bash -c`/`sh -c`/`eval` are read again as scripts;
leading variable assignments and wrappers (`sudo`, `env`, `timeout`, `nohup`, `setsid`, `nice`,
`time`, `xargs`, `exec`, `command`...) are dropped so that `argv[0]` is the program that runs.
Redirections stay in the argv (`>`, `>>`, `<` and their target), so a detector sees what a
command writes. A script shlex cannot read (an unclosed quote) is split on whitespace instead.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator

_SEPARATORS = {";", "&&", "||", "|", "&", "|&", "\n", "(", ")", ";;", "{", "}", "!"}
_KEYWORDS = {"then", "do", "else", "elif", "if", "while", "until", "fi", "done", "esac"}
_WRAPPERS = {
    "sudo",
    "env",
    "timeout",
    "nohup",
    "setsid",
    "nice",
    "ionice",
    "time",
    "stdbuf",
    "exec",
    "command",
    "builtin",
    "xargs",
    "unbuffer",
    "chronic",
    "flock",
}
_SHELLS = {"bash", "sh", "dash", "zsh", "ksh", "ash"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_BACKTICK = re.compile(r"`([^`]*)`")
DEPTH = 4
"""How deep `bash -c "$(...)"` nests are followed."""


def simple_commands(script: str, _depth: int = 0) -> list[list[str]]:
    """Every simple command of `script`, nested ones (substitutions, `bash -c`) included."""
    if _depth > DEPTH or not script.strip():
        return []
    found: list[list[str]] = []
    for inner in _substitutions(script):
        found.extend(simple_commands(inner, _depth + 1))
    for argv in _split(_tokens(script)):
        argv = unwrap(argv)
        if not argv:
            continue
        found.append(argv)
        program = program_name(argv[0])
        if program in _SHELLS:
            nested = _option_value(argv[1:], "-c")
            if nested is not None:
                found.extend(simple_commands(nested, _depth + 1))
        elif program == "eval":
            found.extend(simple_commands(" ".join(argv[1:]), _depth + 1))
    return found


def program_name(word: str) -> str:
    return posixpath.basename(word)


def unwrap(argv: list[str]) -> list[str]:
    """argv without leading assignments, keywords and wrappers (with their own options)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        name = program_name(word)
        if _ASSIGNMENT.match(word) or word in _KEYWORDS:
            i += 1
        elif name in _WRAPPERS:
            i += 1
            # The wrapper's options, and the duration `timeout` takes, come before the command.
            while i < len(argv) and (
                argv[i].startswith("-") or _ASSIGNMENT.match(argv[i]) or _duration(name, argv[i])
            ):
                takes_value = argv[i] in ("-u", "-g", "-n", "-s", "-k", "-C", "-I", "-L", "-P")
                i += 2 if takes_value and i + 1 < len(argv) else 1
        else:
            break
    return argv[i:]


def _duration(wrapper: str, word: str) -> bool:
    return wrapper == "timeout" and bool(re.fullmatch(r"\d+(\.\d+)?[smhd]?", word))


def _tokens(script: str) -> list[str]:
    lexer = shlex.shlex(script, posix=True, punctuation_chars="();<>|&\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return [w for line in script.splitlines() for w in (*line.split(), "\n")]


def _split(tokens: list[str]) -> Iterator[list[str]]:
    current: list[str] = []
    for token in tokens:
        if token in _SEPARATORS:
            if current:
                yield current
            current = []
        else:
            current.append(token)
    if current:
        yield current


def _option_value(args: list[str], option: str) -> str | None:
    """The argument after `option` among a command's leading options (`bash -lc SCRIPT`)."""
    for i, word in enumerate(args):
        if not word.startswith("-"):
            return None
        if word == option or (len(word) > 2 and word[0] == "-" and word[1] != "-" and "c" in word):
            return args[i + 1] if i + 1 < len(args) else None
    return None


def _substitutions(script: str) -> list[str]:
    """The scripts inside `$(...)` and backticks (outermost first)."""
    found = [m.group(1) for m in _BACKTICK.finditer(script)]
    i = 0
    while True:
        start = script.find("$(", i)
        if start < 0:
            return found
        depth, j = 1, start + 2
        while j < len(script) and depth:
            depth += {"(": 1, ")": -1}.get(script[j], 0)
            j += 1
        found.append(script[start + 2 : j - 1])
        i = start + 2
