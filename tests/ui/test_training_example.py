"""The training view on examples/grpo_cpu.py's own run: SmolLM2 on CPU behind `rolltap serve
--runner`, two GRPO iterations whose figures the example posts (`client.post_metrics`). Opened
in Debian's chromium from the batches page, every policy version's row is checked against the
example's report.json: its batch, groups, mean reward, calls on the policy's own weights (no
staleness), the logprob mismatch and seconds per phase it measured, its loss and gradient norm;
and the held-out batches, picked by their label, against the report's held-out figures. It
leaves a screenshot (`training-grpo.png`, the `screenshots` fixture)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.training_view import (
    browser_errors,
    chart_points,
    open_session,
    running_ui,
    shoot,
    shown_versions,
)
from tests.ui.conftest import browser_missing

pytestmark = [pytest.mark.slow, pytest.mark.model]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_cpu.py"
SMALL = ["--iterations", "2", "--tasks", "2", "--samples", "4"]
SMALL_HELDOUT = ["--heldout", "2", "--heldout-samples", "2"]
"""Where the example evaluates held-out tasks (its --heldout flag), as few as it takes."""


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The example's work directory (its store) and its report."""
    reason = browser_missing()
    if reason is not None:
        pytest.skip(reason)  # minutes of CPU for nothing to look at
    out = tmp_path_factory.mktemp("grpo-example")
    heldout = "--heldout" in EXAMPLE.read_text()
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *SMALL, *(SMALL_HELDOUT if heldout else []), "--out", out],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, json.loads((out / "report.json").read_text())


@pytest.mark.timeout(1800)
def test_the_training_view_shows_the_example_run(
    browser: Any, example_run: tuple[Path, dict[str, Any]], screenshots: Path
) -> None:
    out, report = example_run
    check_example_view(browser, f"sqlite:///{out / 'rolltap.sqlite'}", report, screenshots)


def check_example_view(browser: Any, db_url: str, report: dict[str, Any], folder: Path) -> None:
    iterations = report["iterations"]
    with running_ui(db_url) as base:
        run = open_session(browser, base)
        if report.get("heldout"):
            # The held-out evaluations share the session (and versions): the training batches
            # are those labelled set=train.
            browser.get(run + "&label=set%3Dtrain")
        shown = shown_versions(browser)
        assert [v.version for v in shown] == [it["policy_version"] for it in iterations]
        for row, it in zip(shown, iterations, strict=True):
            assert it["batch_id"] in row.batches
            assert row.number("kept") == it["groups"]
            assert row.number("dropped") == 0
            assert row.number("mean_reward") == pytest.approx(it["mean_reward"], abs=1e-9)
            # Sampled on the policy's own weights: the report's call versions say so too.
            assert it["call_versions"] == [it["policy_version"]]
            assert row.number("calls") > 0
            assert row.number("staleness_max") == 0
            assert row.number("off_policy") == 0
            # What the example measured and posted, exactly.
            assert row.number("mismatch_max") == it["mismatch"]["max_abs"]
            assert row.number("mismatch_mean") == it["mismatch"]["mean_abs"]
            assert row.texts["mismatch_max"] == f"{it['mismatch']['max_abs']:.2e}"
            assert row.phases == it["seconds"]
            assert row.posted["loss"] == it["loss"]
            assert row.posted["grad_norm"] == it["grad_norm"]
            assert f"loss {it['loss']:.4g}" in row.posted_text
        assert len(chart_points(browser, "reward", "mean reward")) == len(iterations)
        assert len(chart_points(browser, "mismatch", "max")) == len(iterations)
        assert browser_errors(browser) == []
        shoot(browser, folder, "training-grpo")
        heldout = report.get("heldout") or []
        if heldout:
            browser.get(run + "&label=set%3Dheldout")
            evaluated = shown_versions(browser)
            assert [v.version for v in evaluated] == [h["policy_version"] for h in heldout]
            for row, h in zip(evaluated, heldout, strict=True):
                assert h["batch_id"] in row.batches
                assert row.number("mean_reward") == pytest.approx(h["mean_reward"], abs=1e-9)
            assert browser_errors(browser) == []
