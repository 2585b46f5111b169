"""The training view as a browser test reads it: `rolltap ui` as its own process, and each policy
version's row as the page shows it (the exact values behind the cells, their text, the phases
and the rest the trainer posted)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.processes import free_port


@contextlib.contextmanager
def running_ui(db_url: str) -> Iterator[str]:
    """`rolltap ui --db db_url` on a free port; yields its URL."""
    port = free_port()
    command = [sys.executable, "-m", "rolltap.cli.main", "ui", "--db", db_url, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/", timeout=5):
                    break
            except OSError:
                assert process.poll() is None, "rolltap ui exited"
                assert time.monotonic() < deadline, "rolltap ui did not start"
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


@dataclass(frozen=True)
class ShownVersion:
    version: str
    values: dict[str, str]
    """Metric -> the exact value behind its cell ('' for none)."""
    texts: dict[str, str]
    """Metric -> the cell's text."""
    phases: dict[str, float]
    posted: dict[str, Any]
    """What else the trainer posted: name -> the value as posted."""
    posted_text: str
    batches: str

    def number(self, metric: str) -> float:
        return float(self.values[metric])


def shown_versions(browser: Any) -> list[ShownVersion]:
    """The rows of the run page open in `browser`, one per policy version, in page order."""
    from selenium.webdriver.common.by import By

    sampling = browser.find_elements(By.CSS_SELECTOR, "table.sampling tbody tr")
    posted = browser.find_elements(By.CSS_SELECTOR, "table.posted tbody tr")
    shown = []
    for row, other in zip(sampling, posted, strict=True):
        version = row.get_attribute("data-version")
        assert other.get_attribute("data-version") == version
        cells = [c for r in (row, other) for c in r.find_elements(By.CSS_SELECTOR, "[data-metric]")]
        shown.append(
            ShownVersion(
                version=version,
                values={
                    c.get_attribute("data-metric"): c.get_attribute("data-value") for c in cells
                },
                texts={c.get_attribute("data-metric"): c.text for c in cells},
                phases={
                    p.get_attribute("data-phase"): float(p.get_attribute("data-value"))
                    for p in other.find_elements(By.CSS_SELECTOR, "[data-phase]")
                },
                posted={
                    p.get_attribute("data-posted"): json.loads(p.get_attribute("data-value"))
                    for p in other.find_elements(By.CSS_SELECTOR, "[data-posted]")
                },
                posted_text=other.find_element(By.CSS_SELECTOR, "td.other").text,
                batches=row.find_elements(By.CSS_SELECTOR, "td")[0].text,
            )
        )
    return shown


def chart_points(browser: Any, chart: str, series: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(
        browser.find_elements(By.CSS_SELECTOR, f'#chart-{chart} circle[data-series="{series}"]')
    )


def open_session(browser: Any, base: str, session: str | None = None) -> str:
    """From the batches page to a session's run, as a person would (the only session when
    `session` is None); returns the run's URL."""
    from selenium.webdriver.common.by import By

    browser.set_window_size(1400, 1000)
    browser.get(base + "/")
    browser.find_element(By.LINK_TEXT, "training runs →").click()
    links = browser.find_elements(By.CSS_SELECTOR, 'table.sessions a[href^="/training?session="]')
    if session is None:
        assert len(links) == 1, [link.text for link in links]
        links[0].click()
    else:
        (link,) = [a for a in links if a.get_attribute("href").endswith(f"session={session}")]
        link.click()
    return str(browser.current_url)


def browser_errors(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def shoot(browser: Any, folder: Path, name: str) -> Path:
    """A full-page screenshot (the window grown to the page and its frame)."""
    height = browser.execute_script(
        "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight"
    )
    browser.set_window_size(1400, min(max(height, 600), 16_000))
    path = folder / f"{name}.png"
    assert browser.save_screenshot(str(path)), path
    browser.set_window_size(1400, 1000)
    print(f"screenshot: {path}")
    return path
