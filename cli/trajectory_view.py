"""The segment and drift view of one rollout, for `rolltap show`: where the chain broke, why."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..analysis.trajectory import RolloutTrajectories, Trajectory
from ..store.models import LinkKind

_STRIP = 64
_ROLE_STYLE = {"main": "bold", "side": "cyan", "sibling": "magenta"}


def render_segments(console: Console, built: RolloutTrajectories) -> None:
    f = built.faithfulness
    breaks = ", ".join(f"{kind} {n}" for kind, n in sorted(f.breaks.items())) or "none"
    style = "green" if f.share == 1.0 else "yellow" if f.share >= 0.9 else "red"
    console.print(
        f"[bold]faithfulness[/bold] [{style}]{f.share:.1%}[/{style}] of {f.sampled_tokens} "
        f"sampled tokens still in their context · breaks: {breaks} · side calls {f.side_calls}"
        f" · siblings {f.siblings} · text-only calls {f.text_only_calls}"
        f" · skipped {_calls_count(f.skipped_calls)}"
    )
    if not built.trajectories:
        console.print("  no token-faithful calls")
        return
    table = Table(box=None, header_style="bold")
    for column in ("seg", "role", "calls", "prompt", "response", "sampled", "lost", "from", "why"):
        table.add_column(column, justify="right" if column in ("prompt", "response") else "left")
    table.add_column("tokens (prompt ▒ · context ░ · sampled █ · lost [red]▓[/red])")
    for t in built.trajectories:
        table.add_row(
            f"#{t.segment}",
            Text(t.role.value, style=_ROLE_STYLE[t.role.value]),
            _seqs([built.seqs.get(c, 0) for c in t.call_ids]),
            str(len(t.prompt_ids)),
            str(len(t.response_ids)),
            str(t.sampled_tokens),
            str(t.lost_tokens) if t.lost_tokens else "-",
            _origin(built, t),
            _why(t),
            _strip(built, t),
        )
    console.print(table)
    for t in built.trajectories:
        drift = None if t.link is None else t.link.drift
        if drift is None:
            continue
        where = f"in the answer of call {built.seqs.get(drift.region_call, '?')}"
        if drift.region == "context":
            where = f"in the context before call {built.seqs.get(drift.region_call, '?')}'s answer"
        console.print(
            f"  [red]break[/red] #{t.segment}: [bold]{drift.kind.value}[/bold] at token "
            f"{drift.position} {where} ({drift.evidence}): {drift.note}"
        )
        if drift.parent_text is not None:
            console.print(Text(f"      was: {drift.parent_text!r}", style="dim"))
            console.print(Text(f"      now: {drift.child_text!r}", style="dim"))
    if built.skipped:
        # Named `call N`, as everywhere else here: a bare number beside the summary's count
        # reads as another count.
        skipped = ", ".join(f"call {s.seq} ({s.reason})" for s in built.skipped)
        console.print(f"  skipped (in no segment): {skipped}")


def _calls_count(n: int) -> str:
    return f"{n} call" if n == 1 else f"{n} calls"


def _origin(built: RolloutTrajectories, t: Trajectory) -> str:
    link = t.link
    if link is None:
        return "-"
    choice = "" if link.choice is None else f"/{link.choice}"
    call = built.seqs.get(link.call_id, "?")
    return f"#{link.parent_segment} · call {call}{choice} @ {link.position}"


def _why(t: Trajectory) -> Text:
    link = t.link
    if link is None:
        return Text("-")
    if link.kind is LinkKind.BREAK and link.drift is not None:
        return Text(link.drift.kind.value, style="red")
    return Text(link.kind.value, style=_ROLE_STYLE.get(link.kind.value, ""))


def _seqs(seqs: list[int]) -> str:
    """1,2,3,5 as 1-3,5."""
    runs: list[list[int]] = []
    for s in seqs:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _strip(built: RolloutTrajectories, t: Trajectory) -> Text:
    """The whole sequence squeezed into a fixed width: what was prompt, context, sampled, lost."""
    n = len(t.prompt_ids) + len(t.response_ids)
    kind = np.zeros(n, dtype=np.int8)  # 0 prompt, 1 context, 2 sampled, 3 lost
    kind[len(t.prompt_ids) :] = 1 + t.loss_mask
    for other in built.trajectories:
        link = other.link
        if link is not None and link.kind is LinkKind.BREAK and link.parent_segment == t.segment:
            lost = np.arange(n) >= link.position
            kind[lost & (kind == 2)] = 3
    width = min(_STRIP, n)
    starts = np.linspace(0, n, width + 1).astype(np.int64)[:-1]
    worst = np.maximum.reduceat(kind, starts) if n else kind
    glyphs = {0: ("▒", "blue"), 1: ("░", "dim"), 2: ("█", "green"), 3: ("▓", "red")}
    text = Text()
    for cell in worst.tolist():
        text.append(*glyphs[cell])
    return text
