"""The committed reports as a reader opens them: in a real browser (Debian's headless Chromium), at 1400 x 900, the
findings and the top of the first figure are on the first screen, and nothing runs off the page sideways.

The page is measured by a script added to a copy of it (the committed file is not changed): after every image has
loaded it writes its measures into the page, and Chromium's --dump-dom prints them. Without Chromium the tests skip
with the reason; AIAYN_REQUIRE_BROWSER=1 (CI sets it, after installing Debian's chromium) makes that a failure."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "reports" / "reference" / "real" / "table3-real.html",
    ROOT / "reports" / "reference" / "table3-quick.html",
]
WIDTH, HEIGHT = 1400, 900

MEASURE = """
<script>
window.addEventListener("load", () => {
  const box = (el) => (el ? el.getBoundingClientRect() : null);
  const findings = box(document.querySelector("section.findings"));
  const figure = box(document.querySelector("section.figures figure img"));
  const out = {
    width: window.innerWidth, height: window.innerHeight,
    scroll_width: document.documentElement.scrollWidth,
    findings_bottom: findings ? findings.bottom : null,
    figure_top: figure ? figure.top : null,
    figure_loaded: document.querySelector("section.figures figure img")?.naturalWidth > 0,
  };
  const pre = document.createElement("pre");
  pre.id = "aiayn-measure";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found:
        return found
    reason = "no Chromium on PATH (apt-get install chromium)"
    if os.environ.get("AIAYN_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def measure(page: Path, tmp_path: Path) -> dict:
    copy = tmp_path / page.name
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
    args += ["--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
    args += [
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={WIDTH},{HEIGHT}",
        "--virtual-time-budget=10000",
    ]
    done = subprocess.run([*args, "--dump-dom", copy.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="aiayn-measure">(.*?)</pre>', done.stdout, re.S)
    assert found, f"Chromium printed no measures (exit {done.returncode}): {done.stderr[-1500:]}"
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.mark.parametrize("page", PAGES, ids=[p.parent.name + "/" + p.name for p in PAGES])
def test_a_report_shows_what_it_found_and_its_first_figure_on_the_first_screen(page, tmp_path):
    m = measure(page, tmp_path)
    assert m["scroll_width"] <= m["width"], f"{page.name} runs off the page: {m['scroll_width']} px > {m['width']}"
    assert m["figure_loaded"] and m["figure_top"] is not None and m["figure_top"] < m["height"], m
    assert m["findings_bottom"] is not None and m["findings_bottom"] <= m["height"], m
