"""report.html: per-area counts, filters by status and area, a search box, links to each claim's
YAML line, the roofline inlined, the partial banner — and, where chromium is installed, the
filters really filtering in a headless browser."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from resacct.reporting import render_html

ROOT = "/home/someone/resacct"


def _record(claim_id: str, area: str, outcome: str, line: int, **extra) -> dict:
    return {"id": claim_id, "area": area, "outcome": outcome, "path": f"specs/{area}.claims.yaml", "line": line,
            "says": f"{claim_id} says something", "source": "000_seed.txt", **extra}


def _document(**run) -> dict:
    claims = [
        _record("matmul-2mkn", "flops", "holds", 3, law="2*m*k*n", law_value=120, measured=120, inputs={"m": 2, "k": 3, "n": 10},
                forall={"m": "dim"}, examples=40, example="worst", deviation=0.0, evidence="measured"),
        _record("step-6nd", "flops", "refuted", 12, law="6*batch*params", law_value=432, measured=368, truth="autograd skips dx of layer one",
                evidence="measured"),
        _record("gpt3-ffn-gb", "memory", "refuted", 7, law="2300000000.0", law_value=2.3e9, measured=2415919104, truth="2.42 GB",
                evidence="arithmetic"),
        _record("h100-peak", "memory", "skipped", 9, message="needs a CUDA GPU", evidence="published"),
        _record("adam-16-bytes", "memory", "failed", 20, law="16*params", law_value=160, measured=120, predicted=120,
                message="specs/memory.claims.yaml:20: claim 'adam-16-bytes' does not hold", evidence="measured"),
    ]
    return {"environment": {"torch": "2.13.0", "device": "cpu"}, "claims": claims, "run": {"rootdir": ROOT, "complete": True, **run}}


def test_the_page_has_counts_filters_search_and_links():
    page = render_html(_document())
    assert re.search(r'<a href="#status=holds,refuted,skipped,inconclusive,failed,invalid&amp;area=memory">memory</a></td><td>0</td>'
                     r'<td><a href="#status=refuted&amp;area=memory">1</a></td><td><a href="#status=skipped&amp;area=memory">1</a></td><td>0</td>'
                     r'<td><a href="#status=failed&amp;area=memory">1</a></td><td>0</td>', page)
    for outcome, count in (("holds", 1), ("refuted", 2), ("skipped", 1), ("inconclusive", 0), ("failed", 1), ("invalid", 0)):
        assert f'<input type="checkbox" name="status" value="{outcome}" checked> {outcome} ({count})' in page
    assert '<select id="area"><option value="">all areas</option><option value="flops">flops</option><option value="memory">memory</option></select>' in page
    assert '<input type="search" id="search"' in page
    assert f'<a href="file://{ROOT}/specs/flops.claims.yaml" title="open the claims file (the claim is at line 12)">specs/flops.claims.yaml:12</a>' in page
    assert "6*batch*params = 432" in page  # the law's value beside its formula
    assert "40 examples, every one exact; the first: m=2, k=3, n=10" in page
    assert 'class="partial"' not in page and "roofline" not in page.split("<script>")[0].split("<nav>")[1].split("</nav>")[0]


def test_the_page_counts_the_evidence_per_area_and_shows_and_filters_it_per_claim():
    page = render_html(_document())
    assert "<th>invalid</th><th " in page and ">measured</th><th " in page and ">published</th><th " in page and ">arithmetic</th></tr>" in page
    everything = "holds,refuted,skipped,inconclusive,failed,invalid"
    assert re.search(rf'>memory</a></td>(<td>.*?</td>){{6}}<td class="kind"><a href="#status={everything}&amp;area=memory&amp;evidence=measured">1</a></td>'
                     rf'<td class="kind"><a href="#status={everything}&amp;area=memory&amp;evidence=published">1</a></td>'
                     rf'<td class="kind"><a href="#status={everything}&amp;area=memory&amp;evidence=arithmetic">1</a></td></tr>', page)
    assert "<tr><th>total</th><th>1</th><th>2</th><th>1</th><th>0</th><th>1</th><th>0</th><th>3</th><th>1</th><th>1</th></tr>" in page
    assert ('<select id="evidence"><option value="">any evidence</option><option value="measured">measured (3)</option>'
            '<option value="published">published (1)</option><option value="arithmetic">arithmetic (1)</option></select>') in page
    row = page[page.index('<tr data-outcome="refuted" data-area="memory" data-evidence="arithmetic">'):]
    row = row[:row.index("</tr>")]
    assert '<div class="note">computed</div>' in row and '<span class="evidence arithmetic" title="resacct&#x27;s own arithmetic' in row
    assert "Evidence, what decides a claim: <b>measured</b>: PyTorch ran it" in page
    unstated = render_html({**_document(), "claims": [dict(record, evidence="<b>bold</b>") for record in _document()["claims"]]})
    assert "<b>bold</b>" not in unstated and unstated.count('data-evidence="unstated"') == 5 and ">unstated</th>" in unstated


def test_the_roofline_is_inlined_and_a_partial_run_says_so():
    page = render_html(_document(complete=False, selection={"areas": ["memory"], "pattern": None}), roofline_png=b"\x89PNG-bytes")
    assert '<div class="partial">PARTIAL REPORT (only area memory): 5 claims, not the full set</div>' in page
    assert '<img class="roofline" alt="measured roofline" src="data:image/png;base64,iVBORy1ieXRlcw==">' in page


CHROMIUM = next((path for path in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
                 if path and Path(path).exists()), None)


# Runs in the page after its own script: drives the real controls (checkboxes, select, search box)
# with the events a person's clicks and typing send, and writes what is visible after each step.
_DRIVER = """<script>
const results = [];
const visible = () => Array.from(document.querySelectorAll("tr[data-outcome]")).filter(row => !row.hidden)
  .map(row => row.querySelector("td.id").firstChild.textContent);
const statuses = wanted => document.querySelectorAll("input[name=status]").forEach(box => {
  box.checked = wanted.includes(box.value); box.dispatchEvent(new Event("change")); });
const area = document.getElementById("area"), search = document.getElementById("search");
results.push(visible());                                    // as loaded from the address's #fragment
area.value = ""; area.dispatchEvent(new Event("change")); statuses(["refuted", "failed"]); results.push(visible());
statuses(["holds", "refuted", "skipped", "failed", "invalid"]); search.value = "AUTOGRAD";
search.dispatchEvent(new Event("input")); results.push(visible());
results.push([location.hash, document.getElementById("shown").textContent]);
const evidence = document.getElementById("evidence"); search.value = ""; search.dispatchEvent(new Event("input"));
evidence.value = "arithmetic"; evidence.dispatchEvent(new Event("change")); results.push(visible());
document.body.insertAdjacentHTML("beforeend", "<pre id='results'>" + JSON.stringify(results) + "</pre>");
</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (Debian: apt-get install chromium)")
def test_the_filters_filter_in_a_headless_browser(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(_document()).replace("</body>", _DRIVER), encoding="utf-8")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri() + "#status=refuted&area=memory"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r"<pre id=\"results\">(.*)</pre>", dom)
    assert found, dom[:3000]
    loaded, refuted_or_failed, searched, (fragment, shown), arithmetic = json.loads(html.unescape(found.group(1)))
    assert loaded == ["gpt3-ffn-gb"]
    assert refuted_or_failed == ["step-6nd", "gpt3-ffn-gb", "adam-16-bytes"]
    assert searched == ["step-6nd"]  # the search is case-blind and reads every cell (here the truth)
    assert fragment == "#status=holds%2Crefuted%2Cskipped%2Cfailed%2Cinvalid&area=&evidence=&q=AUTOGRAD" and shown == "1"
    assert arithmetic == ["gpt3-ffn-gb"]  # the evidence filter
