"""The README and the pages under docs/ can be scanned by someone new: each opens with a short
"What you will do" list, every picture it shows is there, the pictures in docs/img are SVG a
browser draws on its own (valid XML, a viewBox, readable text, nothing fetched from elsewhere),
and the README's Quickstart says what the first `rolltap demo` downloads before it is run."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SVGS = sorted((ROOT / "docs" / "img").glob("*.svg"))
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{2,4} |\*\*)What you will do")
_SVG_NS = "{http://www.w3.org/2000/svg}"
_FONT_SIZE = re.compile(r"font-size\s*[:=]\s*[\"']?\s*([0-9.]+)")
MIN_FONT = 12.0


def _ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _what_you_will_do(page: Path) -> list[str]:
    """The bullets of the page's "What you will do" list, if it starts in its first 30 lines."""
    lines = page.read_text().splitlines()
    start = next((i for i, line in enumerate(lines[:30]) if _HEADING.match(line)), None)
    if start is None:
        return []
    bullets: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("- "):
            bullets.append(line[2:])
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()  # a bullet's continuation
        elif line.strip() or bullets:
            break
    return bullets


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_every_page_opens_with_what_you_will_do(page: Path) -> None:
    bullets = _what_you_will_do(page)
    assert 3 <= len(bullets) <= 6, (
        f"{page.name}: its first 30 lines need a 'What you will do' list of 3 to 6 bullets "
        f"(found {len(bullets)})"
    )


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_every_picture_a_page_shows_exists(page: Path) -> None:
    missing = [
        target
        for target in _IMAGE.findall(page.read_text())
        if "://" not in target and not (page.parent / target).is_file()
    ]
    assert not missing, f"{page.name} shows pictures that are not there: {missing}"


def test_the_pictures_are_svg_and_shown() -> None:
    """docs/img has the drawings of the parts, a rollout's life and a weight update, and every
    SVG there is shown by some page."""
    names = {p.name for p in SVGS}
    assert {"parts.svg", "rollout-life.svg", "weight-update.svg"} <= names, names
    shown = {
        (page.parent / target).resolve()
        for page in PAGES
        for target in _IMAGE.findall(page.read_text())
    }
    unshown = [p.name for p in SVGS if p.resolve() not in shown]
    assert not unshown, f"no page shows {unshown}"


@pytest.mark.parametrize("svg", SVGS, ids=_ids)
def test_every_svg_parses_and_reads(svg: Path) -> None:
    root = ET.parse(svg).getroot()  # raises on anything but well-formed XML
    assert root.tag == f"{_SVG_NS}svg", f"{svg.name}: the root is {root.tag}, not an SVG"
    box = root.get("viewBox", "").replace(",", " ").split()
    assert len(box) == 4, f"{svg.name}: no viewBox"
    assert all(float(v) >= 0 for v in box[2:]), f"{svg.name}: a negative viewBox size"
    for element in root.iter():
        for name, value in element.attrib.items():
            if name.endswith("href"):
                assert value.startswith("#"), f"{svg.name}: refers outside itself: {value}"
        assert "url(http" not in (element.get("style") or ""), f"{svg.name}: fetches a url"
        if element.tag == f"{_SVG_NS}style":
            assert "@import" not in (element.text or ""), f"{svg.name}: imports a stylesheet"
    text = svg.read_text()
    sizes = [float(s) for s in _FONT_SIZE.findall(text)]
    assert sizes, f"{svg.name}: sets no font-size"
    assert min(sizes) >= MIN_FONT, f"{svg.name}: text smaller than {MIN_FONT}px: {min(sizes)}"
    texts = [t for t in root.iter(f"{_SVG_NS}text")]
    assert texts, f"{svg.name}: has no text"


def test_the_quickstart_says_what_the_first_demo_downloads() -> None:
    """Before `rolltap demo` is shown, the Quickstart says the first run installs
    mini-swe-agent, how large it is and that it takes minutes."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^## Quickstart\n(.*?)(?=^## )", readme, re.S | re.M)
    assert match, "the README has no Quickstart section"
    quickstart = match.group(1)
    demo = quickstart.find("rolltap demo")
    assert demo >= 0, "the Quickstart does not show `rolltap demo`"
    shown_with = quickstart[: quickstart.find("```", demo)]
    assert "mini-swe-agent" in shown_with
    assert re.search(r"700\s*MB", shown_with), "the Quickstart does not say how large it is"
    assert "minutes" in shown_with


_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_CLIENT = re.compile(r"\b(Async)?Client\(")


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_every_client_the_docs_open_is_closed(page: Path) -> None:
    """A `Client` or `AsyncClient` made in a page's Python is made by a `with` (`async with`)
    that closes its connections: one left open warns "Unclosed client session" at exit."""
    unclosed = [
        line.strip()
        for block in _PYTHON_BLOCK.findall(page.read_text())
        for line in block.splitlines()
        if _CLIENT.search(line) and not re.match(r"\s*(async\s+)?with\b", line)
    ]
    assert not unclosed, f"{page.name} opens a client outside a with block: {unclosed}"
