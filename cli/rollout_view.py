"""One rollout for `rolltap show`: its outcome and why, its calls, its chain, its segments, and
on request the conversation text of every call."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..analysis.bridging import Bridging
from ..analysis.hacks import flags_of
from ..analysis.reader import rollout_trajectories
from ..analysis.toolparse import ToolParsing, reason_of
from ..audit.integrity import verify_rollout
from ..runner.verify import REWARD_JSON, REWARD_TXT
from ..store import CallView, EgressRecord, EgressVerdict, RolloutView, StoreReader
from .audit import render as render_integrity
from .cells import task_label, when
from .console import console_for_output
from .trajectory_view import render_segments

_TAILS = (("verifier_tail", "verifier output"), ("harness_tail", "harness log"))

# The runner copies the sandbox's /logs/agent and /logs/verifier into the rollout's logs folder
# (meta["logs_dir"]) as agent/ and verifier/ (runner/rollout.py); a log names the sandbox's.
_SANDBOX_LOGS = re.compile(r"(?<![\w./-])/logs/(agent|verifier)(?=/|[^\w.-]|$)")

# mini-swe-agent ends the episode at the agent's `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
# without running it, and prints that step (and any tool call after it in the same answer) as an
# action that was not executed: returncode -1 (its models/utils/actions_toolcall.py). Its log
# ends so on every rollout that submitted, passed ones included. The observation as mini's
# console prints it (content_string.py), and as its mini.yaml template writes it.
_NOT_EXECUTED = (
    ("<returncode>", "-1", "<output>", "<exception_info>", "action was not executed"),
    ("{", '"returncode": -1,', '"output": "", "exception_info": "action was not executed"', "}"),
)
_SUBMIT_STEP = (
    "(the submit step: mini-swe-agent ends the episode at echo "
    "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT without running it, and logs it as returncode -1, "
    '"action was not executed")'
)
_AFTER_SUBMIT = "(a tool call after the submit step: not run, returncode -1)"


def show(
    store: StoreReader, rollout_id: str, detokenizer: Any, *, conversation: bool = False
) -> None:
    rollout = store.rollout(rollout_id)
    calls = store.calls(rollout_id)
    console = console_for_output()
    _header(console, rollout)
    _outcome(console, rollout)
    render_hacks(console, rollout)
    _bridging(console, calls)
    _tool_parsing(console, calls)
    _calls(console, calls)
    if conversation:
        _conversation(console, store, calls)
    # Its hash chain, and the calls the proxy refused (budget, finished, revoked, malformed).
    render_integrity(console, store.run(verify_rollout(store.store, rollout_id)))
    _render_egress(console, store.egress(rollout_id))
    if calls:
        render_segments(console, rollout_trajectories(store, rollout_id, detokenizer=detokenizer))


def render_hacks(console: Console, r: RolloutView) -> None:
    """What the reward-hack detectors flagged (analysis/hacks.py); nothing when never checked."""
    flags = flags_of(r.hack_flags)
    if flags is None:
        return
    if not flags:
        console.print("[bold]hack flags[/bold]  none")
        return
    detectors = sorted({f.detector for f in flags})
    console.print(f"[bold red]hack flags[/bold red]  {len(flags)}: {', '.join(detectors)}")
    for f in flags:
        where = f"seq {f.seq}" if f.seq is not None else f.source
        command = f"  [dim]{escape(f.command)}[/dim]" if f.command else ""
        console.print(f"  [red]{f.detector}[/red] ({where}) {escape(f.reason)}{command}")


def _header(console: Console, r: RolloutView) -> None:
    console.print(
        f"[bold]rollout {r.id}[/bold]  {r.status.value}  reward {r.reward}  {r.verdict.value}"
    )
    console.print(
        f"  task {escape(task_label(r))}  batch {escape(r.batch_id or '-')}  "
        f"harness {r.harness or '-'}  model {escape(r.model or '-')}  created {when(r.created_at)}"
    )
    if r.error:
        console.print(f"  [red]error[/red] {escape(r.error)}")


def _bridging(console: Console, calls: list[CallView]) -> None:
    bridging = Bridging.of(c.bridge for c in calls)
    if bridging is not None:
        rate = bridging.bridge_break_rate
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(bridging.outcomes.items()))
        shown = "- (no call continued a conversation)" if rate is None else f"{rate:.2f}"
        console.print(f"  token-in  bridge_break_rate {shown}  ({outcomes})")


_MALFORMED_LISTED = 10
"""Malformed answers listed one a line; a rollout that garbles every call lists only these."""


def _tool_parsing(console: Console, calls: list[CallView]) -> None:
    parsing = ToolParsing.of(c.tool_parse for c in calls)
    if parsing is None:
        return
    rate = parsing.malformed_call_rate
    shown = "- (no answer wrote a call)" if rate is None else f"{rate:.2f}"
    counts = f"ok {parsing.ok}, malformed {parsing.malformed}, none {parsing.none}"
    console.print(f"  tool calls  malformed_call_rate {shown}  ({counts})")
    # Each malformed answer by its own call's number: a reason alone (`tool call 1: no name`)
    # does not say which call wrote it, and two answers can fail alike.
    malformed = [(c.seq, r) for c in calls if (r := reason_of(c.tool_parse)) is not None]
    for seq, reason in malformed[:_MALFORMED_LISTED]:
        sep = ", " if reason.startswith("tool call ") else ": "
        console.print(f"    malformed: call {seq}{sep}{escape(reason)}")
    if len(malformed) > _MALFORMED_LISTED:
        more = len(malformed) - _MALFORMED_LISTED
        console.print(f"    and {more} more malformed answers (each call's tool_parse: --json)")


def _outcome(console: Console, r: RolloutView) -> None:
    """Why the reward is what it is: the harness's ending, the verdict and what gave it, the
    verifier's and harness's last lines, and where their whole logs are."""
    details = r.reward_details or {}
    facts = [
        f"{k} {details[k]}"
        for k in ("ending", "harness_detail", "harness_exit_code")
        if details.get(k) not in (None, "")
    ]
    if facts:
        console.print(f"  [bold]outcome[/bold] {escape(', '.join(facts))}")
    logs_dir = r.meta.get("logs_dir")
    host = str(logs_dir) if logs_dir else None
    verdict = _verdict(r, host)
    if verdict:
        console.print(f"  [bold]verdict[/bold] {escape(verdict)}")
    for key, label in _TAILS:
        tail = r.meta.get(key)
        if isinstance(tail, str) and tail:
            console.print(f"  [bold]{label}[/bold] (last lines)")
            for line, note in _log_lines(on_host(tail, host)):
                shown = f"[dim]{escape(line)}[/dim]" if note else escape(line)
                console.print(f"    {shown}", soft_wrap=True)
    if host:
        console.print(f"  [bold]logs[/bold] {escape(host)}")


def _verdict(r: RolloutView, logs_dir: str | None) -> str | None:
    """Which figure is the verdict: the reward and where it came from (the reward file the
    tests wrote, or their exit code where the task reads it so and they wrote none), then how
    the tests exited, which a reward file overrules (runner/verify.py)."""
    if r.reward is None:
        return None  # unverified: the header and the error say why
    details = r.reward_details or {}
    shown = f"{r.verdict.value}: reward {r.reward}"
    exit_code = details.get("test_exit_code")
    source = None if exit_code is None else _reward_source(details, exit_code, logs_dir)
    if source is not None:
        shown += f" (from {source})"
    values = details.get("values")
    if isinstance(values, dict) and set(values) != {"reward"}:
        shown += ", of " + ", ".join(f"{k} {v}" for k, v in values.items())
    if exit_code is None:
        return shown
    shown += f"; tests exited {exit_code}"
    if source in (REWARD_JSON, REWARD_TXT, _FROM_FILE):
        shown += " (the reward file decides, not the exit code)"
    return shown


_FROM_EXIT_CODE = "the tests' exit code: they wrote no reward file"
_FROM_FILE = "the reward file"


def _reward_source(details: dict[str, Any], exit_code: object, logs_dir: str | None) -> str:
    """Where a verified rollout's reward came from: its verifier's copy in the logs folder
    says, where this machine has it; else a reward the exit code cannot have given (0 for an
    exit 0) came from the file."""
    if logs_dir:
        verifier = Path(logs_dir) / "verifier"
        for name in (REWARD_JSON, REWARD_TXT):
            if (verifier / name).is_file():
                return name
        if verifier.is_dir():
            return _FROM_EXIT_CODE
    values = details.get("values")
    by_exit_code = {"reward": 1.0 if exit_code == 0 else 0.0}
    if isinstance(values, dict) and values != by_exit_code:
        return _FROM_FILE
    return "the reward file, or the exit code where the task writes none"


def on_host(text: str, logs_dir: str | None) -> str:
    """`text` with the sandbox's log folders (/logs/agent, /logs/verifier) as the host's copies
    of them in `logs_dir`; unchanged without one."""
    if not logs_dir:
        return text
    root = logs_dir.rstrip("/")
    return _SANDBOX_LOGS.sub(lambda m: f"{root}/{m.group(1)}", text)


def _log_lines(tail: str) -> list[tuple[str, bool]]:
    """A log's last lines, each with whether it is rolltap's note: mini-swe-agent's submit step
    (and a tool call after it) said as what it is instead of as a command that failed."""
    lines = tail.splitlines()
    shown: list[tuple[str, bool]] = []
    submitted = False
    i = 0
    while i < len(lines):
        block = next(
            (b for b in _NOT_EXECUTED if tuple(x.strip() for x in lines[i : i + len(b)]) == b),
            None,
        )
        if block is None:
            # Between two observations of one answer mini prints only their `Tool:` header.
            submitted = submitted and lines[i].strip() == "Tool:"
            shown.append((lines[i], False))
            i += 1
            continue
        shown.append((_AFTER_SUBMIT if submitted else _SUBMIT_STEP, True))
        submitted = True
        i += len(block)
    return shown


def _calls(console: Console, calls: list[CallView]) -> None:
    table = Table(box=None, header_style="bold")
    for column in (
        "seq",
        "dialect",
        "status",
        "http",
        "prompt",
        "completion",
        "n",
        "finish",
        "ttft ms",
        "total ms",
        "capture",
        "backend",
        "note",
    ):
        table.add_column(column)
    for c in calls:
        bridge = c.bridge and f"token-in {c.bridge}"
        notes = [
            x for x in (c.purpose, bridge, c.retry_of and f"retry of {c.retry_of}", c.error) if x
        ]
        table.add_row(
            str(c.seq),
            c.dialect.value + (" (stream)" if c.stream else ""),
            c.status.value,
            str(c.http_status or "-"),
            str(c.prompt_tokens),
            str(c.completion_tokens),
            str(c.n_choices),
            c.finish_reason or "-",
            _ms(c.received_at, c.first_token_at),
            _ms(c.received_at, c.finished_at),
            c.capture.value,
            c.backend or "-",
            escape("; ".join(notes)[:80]),
        )
    console.print(table)


def _conversation(console: Console, store: StoreReader, calls: list[CallView]) -> None:
    """Each call's new messages (a harness resends its history) and the answer it got, as
    `rolltap ui` reduces them, in any dialect."""
    from ..ui.conversation import exchanges
    from ..ui.diff import turn_text

    bodies = {c.id: store.call_bodies(c.id) for c in calls}
    for x in exchanges(calls, bodies):
        c = x.call
        console.rule(f"call {c.seq} ({c.dialect.value}{', ' + c.purpose if c.purpose else ''})")
        if x.sent is None:
            console.print("  (request body not recorded or not understood)")
        if x.edit is not None:
            console.print(f"  [yellow]the harness changed message {x.edit.index}:[/yellow]")
            console.print(f"  {escape(x.edit.note)}")
        for _, turn in x.new:
            console.print(escape(turn_text(turn)), soft_wrap=True)
        for i, answer in enumerate(x.answers):
            label = "answer" if len(x.answers) == 1 else f"answer {i}"
            console.print(f"[bold]{label}[/bold]")
            for turn in answer:
                console.print(escape(turn_text(turn)), soft_wrap=True)


def _render_egress(console: Console, records: list[EgressRecord]) -> None:
    """What the sandbox sent out through the egress gate (nothing without `--egress`)."""
    if not records:
        return
    denied = sum(r.verdict is EgressVerdict.DENIED for r in records)
    console.print(f"[bold]egress[/bold]  {len(records)} requests, {denied} denied")
    table = Table(box=None, header_style="bold")
    for column in ("time", "verdict", "http", "method", "host", "path", "sent", "got", "reason"):
        table.add_column(column, overflow="fold")
    colour = {EgressVerdict.DENIED: "red", EgressVerdict.INTERCEPTED: "cyan"}
    for r in records:
        verdict = r.verdict.value
        if r.verdict in colour:
            verdict = f"[{colour[r.verdict]}]{verdict}[/{colour[r.verdict]}]"
        table.add_row(
            r.at.strftime("%H:%M:%S.%f")[:-3],
            verdict,
            str(r.status or "-"),
            r.method,
            r.host,
            r.path[:60],
            str(r.request_bytes),
            str(r.response_bytes),
            "" if r.verdict is EgressVerdict.ALLOWED else r.reason[:80],
        )
    console.print(table)


def _ms(start: datetime, end: datetime | None) -> str:
    return "-" if end is None else f"{(end - start).total_seconds() * 1000:.0f}"
