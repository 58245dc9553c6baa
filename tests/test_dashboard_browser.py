"""End to end in a real browser: headless Chromium loads Quiver's dashboard pages during runs.

Needs the Debian packages ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and
``selenium`` (the ``test`` extra); skips, saying so, when no browser is installed.
With ``QUIVER_SCREENSHOTS=docs`` it saves ``docs/dashboard-exploration.png`` and
``docs/dashboard-training.png``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pipelines import Pipeline, grid
from tests import steps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: headless Chromium

CHROMEDRIVER = "/usr/bin/chromedriver"
ROOT = Path(__file__).resolve().parents[1]

# Bokeh 3 renders into shadow roots: collect the text of the whole tree, shadow roots included.
PAGE_TEXT = """
function collect(node) {
  let out = '';
  if (node.shadowRoot) out += collect(node.shadowRoot);
  for (const child of node.childNodes) {
    if (child.nodeType === Node.TEXT_NODE) out += child.textContent + ' ';
    else if (child.nodeType === Node.ELEMENT_NODE) out += collect(child);
  }
  return out;
}
return collect(document.body);
"""


MODELS = """
const D = window.Bokeh && Bokeh.documents[0];
const titles = [], lines = [];
if (D) for (const m of D.all_models) {
  if (typeof m.text === "string") titles.push(m.text);
  if (m.data && m.data.xs) lines.push(m.data.xs.length);
}
return {titles: titles, lines: lines};
"""


def _browser_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture
def browser():
    binary = _browser_binary()
    if binary is None or not os.path.exists(CHROMEDRIVER):
        pytest.skip("no browser installed: apt-get install -y chromium chromium-driver (.ci/run does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="quiver-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={profile}", "--window-size=1400,1300",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def page_text(driver) -> str:
    return " ".join(driver.execute_script(PAGE_TEXT).split())


def wait_for(driver, predicate, timeout=30.0, what="content"):
    deadline = time.time() + timeout
    text = ""
    while time.time() < deadline:
        text = page_text(driver)
        if predicate(text):
            return text
        time.sleep(0.25)
    raise AssertionError(f"page never showed {what}; it showed: {text[:1500]}")


def screenshot(driver, name: str) -> None:
    target = os.environ.get("QUIVER_SCREENSHOTS")
    if target:
        out = (ROOT / target) if not os.path.isabs(target) else Path(target)
        out.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out / name))


def open_page(driver, url, timeout=20.0):
    """Load ``url``; retry while it is not there yet (the run registers the pages as it starts)."""
    deadline = time.time() + timeout
    while True:
        driver.get(url)
        if "404" not in driver.title and "Not Found" not in page_text(driver)[:200]:
            return
        if time.time() > deadline:
            raise AssertionError(f"{url} was never served")
        time.sleep(0.3)


def start_run(node, client):
    box: dict = {}

    def go():
        try:
            box["result"] = node.run(client, progress=False, quiet=True)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            box["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, box


def test_exploration_page_shows_branches_live_and_the_chosen_one(client, browser):
    src = Pipeline("browser").source(steps.source, seed=1)
    scaled = src.explore("a", grid(steps.add, n=[1, 2, 3]))
    scored = scaled.explore("b", grid(steps.mul, n=[1, 10]))
    slow = scored.explore("wait", grid(steps.sleep_then, seconds=[0.5, 1.0]))
    node = slow.choose("x", mode="max")
    base = client.dashboard_link.rsplit("/", 1)[0]
    t, box = start_run(node, client)
    open_page(browser, base + "/quiver-exploration")
    # during the run: the run is listed as running, and the table lists its branches
    text = wait_for(browser, lambda s: "run " in s and "running" in s and "sleep_then" in s, what="the running run")
    assert "12 branches" in text
    t.join(60)
    assert "error" not in box, box.get("error")
    result = box["result"]
    chosen = int(result.chosen.index[0])
    # after: the same page (no reload) updates over its websocket and shows the chosen branch
    row = re.compile(rf"\b{chosen} add mul sleep_then \d+ \d+ [\d.]+ [\d.]+ chosen chosen\b")
    text = wait_for(browser, lambda s: "finished" in s and f"Chosen: #{chosen}" in s and row.search(s),
                    what="the chosen branch in the header and the table")
    assert len(re.findall(r"\b\d+ add mul sleep_then \d+ \d+ [\d.]+ [\d.]+ done\b", text)) == 11
    assert "Quiver-Exploration" in text  # linked in Dask's own navigation bar
    screenshot(browser, "dashboard-exploration.png")


MEMORY = """
const D = window.Bokeh && Bokeh.documents[0];
const out = {titles: [], samples: [], spans: 0, header: null};
if (D) for (const m of D.all_models) {
  if (m.text && typeof m.text === "string" && m.text.startsWith("Memory: worker")) out.titles.push(m.text);
  if (m.text && typeof m.text === "string" && m.text.startsWith("<h4>Memory")) out.header = m.text;
  if (m.data && m.data.managed && m.data.spilled) out.samples.push(m.data.t.length);
  if (m.type === "Span" || (m.constructor && m.constructor.__name__ === "Span")) { if (m.visible) out.spans += 1; }
}
return out;
"""


def test_exploration_page_draws_memory_per_worker(client, browser):
    from tests.test_memory_timeline import three_blocks

    base = client.dashboard_link.rsplit("/", 1)[0]
    t, box = start_run(three_blocks(name="browser-memory", mib=20), client)
    open_page(browser, base + "/quiver-exploration")
    t.join(60)
    assert "error" not in box, box.get("error")
    wait_for(browser, lambda s: "browser-memory" in s and "finished" in s, what="the finished run")
    deadline = time.time() + 20
    drawn = browser.execute_script(MEMORY)
    while time.time() < deadline and (len(drawn["titles"]) < 2 or min(drawn["samples"] or [0]) < 3):
        time.sleep(0.25)
        drawn = browser.execute_script(MEMORY)
    # one figure per worker (the cluster's two), each drawn from the run's samples
    assert len(drawn["titles"]) == 2 and all("limit" in t_ and "Dask pauses at" in t_ for t_ in drawn["titles"]), drawn
    assert len(drawn["samples"]) == 2 and min(drawn["samples"]) >= 3, drawn
    assert drawn["spans"] >= 4  # limit and pause, per worker (no memory plan here: no predicted line)
    assert "samples per worker" in drawn["header"]
    text = page_text(browser)
    assert "Memory" in text
    browser.execute_script("window.scrollTo(0, 380)")  # the tree's top, then the memory panel
    screenshot(browser, "dashboard-memory.png")


def test_training_page_shows_curves_of_each_training_branch(client, browser):
    gpu = pytest.importorskip("gpu")
    mlp = functools.partial(gpu.MLP, 64, 10, hidden=(32,))
    runs = (
        Pipeline("browser-train")
        .source(gpu.load_digits_tensors, seed=0)
        .explore("train", grid(gpu.train, model=[mlp], lr=[0.05, 0.2], epochs=[4], replicas=["auto"], max_replicas=[3]))
    )
    base = client.dashboard_link.rsplit("/", 1)[0]
    t, box = start_run(runs.choose("accuracy"), client)
    open_page(browser, base + "/quiver-training")
    wait_for(browser, lambda s: "browser-train" in s and "sma" in s, what="a training branch", timeout=60)
    t.join(120)
    assert "error" not in box, box.get("error")
    text = wait_for(browser, lambda s: s.count("4/4") >= 2 and s.count(" done ") >= 2, what="both branches done")
    assert "accuracy of z" in text and "replicas per worker" in text
    # the figures draw on canvases: ask BokehJS what they hold
    models = browser.execute_script(MODELS)
    for title in ("Accuracy of z", "Spread of the replicas", "Throughput", "Replicas per worker", "Auto-tuner",
                  "Compute (solid) vs sync"):
        assert any(t.startswith(title) for t in models["titles"]), models["titles"]
    assert max(models["lines"]) >= 4  # loss: test and train lines for both branches
    assert models["lines"].count(2) >= 4  # accuracy, spread, throughput, replicas (and tuning): one line per branch
    screenshot(browser, "dashboard-training.png")
    browser.get(base + "/quiver-exploration")
    chosen = int(box["result"].chosen.index[0])
    wait_for(browser, lambda s: f"Chosen: #{chosen}" in s, what="the chosen training branch")


REPORTS = """
const D = window.Bokeh && Bokeh.documents[0];
const out = {title: null, lines: 0, marks: 0, rungs: []};
if (D) for (const m of D.all_models) {
  if (typeof m.text === "string" && m.text.startsWith("Reports:")) out.title = m.text;
  if (m.data && m.data.xs && m.data.label && m.data.label.some(l => l.endsWith("(pruned)"))) out.lines = m.data.xs.length;
  if (m.data && m.data.x && m.data.label && m.data.label.some(l => l.includes("pruned at iteration"))) out.marks = m.data.x.length;
  if (m.data && m.data.x0 && !m.data.xs) out.rungs = Array.from(m.data.x0);
}
return out;
"""


def test_training_page_draws_report_curves_rungs_and_pruned_ends(client, browser, tmp_path):
    from tests.test_prune_run import exploration  # scripted curves under halving(factor=3)

    base = client.dashboard_link.rsplit("/", 1)[0]
    t, box = start_run(exploration(tmp_path, delay=0.1), client)
    open_page(browser, base + "/quiver-training")
    t.join(60)
    assert "error" not in box, box.get("error")
    result = box["result"]
    pruned = int((result.table["status"] == "pruned").sum())
    text = wait_for(browser, lambda s: "6 branch(es) reported score" in s and f"{pruned} pruned" in s,
                    what="the report curves of the pruning run")
    assert "rungs at iterations 1, 3, 9" in text
    drawn = browser.execute_script(REPORTS)  # the figure draws on a canvas: ask BokehJS what it holds
    assert drawn["title"].startswith("Reports: score (max) per iteration")
    assert drawn["lines"] == 6 and drawn["marks"] == pruned and drawn["rungs"] == [1, 3, 9]


LEGENDS = """
const D = window.Bokeh && Bokeh.documents[0];
const out = {titles: [], labels: [], outside: 0, inside: 0};
const legend = (r) => r && r.click_policy !== undefined && r.items !== undefined;
if (D) for (const m of D.all_models) {
  if (Array.isArray(m.center) && Array.isArray(m.below)) {  // a figure
    if (m.visible && m.title) out.titles.push(m.title.text);
    out.outside += m.below.filter(legend).length;
    out.inside += m.center.filter(legend).length;
  }
  if (m.data && m.data.xs && m.data.label) for (const l of m.data.label) out.labels.push(l);
}
return out;
"""


def test_a_loops_training_page_names_each_width_and_keeps_legends_off_the_curves(client, browser):
    """A plain gpu.Loop over two network widths: each curve is labelled by what differs (the
    loop's model and the rate), never an address; the panels are a loop's (no "of z", no
    replicas) and every legend stands beside its plot. QUIVER_SCREENSHOTS=docs saves
    docs/dashboard-training-loop.png."""
    gpu = pytest.importorskip("gpu")
    import pipelines

    loops = [gpu.Loop(model=functools.partial(gpu.MLP, 64, 10, hidden=(w,))) for w in (8, 32)]
    node = (Pipeline("browser-loop").source(gpu.load_digits_tensors, seed=0)
            .explore("t", grid(gpu.train_loop, loop=loops, lr=[0.001, 0.1], momentum=[0.9], epochs=[4],
                               batch_size=[32]))
            .choose("accuracy", prune=pipelines.halving(factor=2)))
    base = client.dashboard_link.rsplit("/", 1)[0]
    t, box = start_run(node, client)
    open_page(browser, base + "/quiver-training")
    t.join(120)
    assert "error" not in box, box.get("error")
    text = wait_for(browser, lambda s: "browser-loop" in s and s.count(" done ") >= 2, what="the loops done", timeout=60)
    address = re.compile(r"0x[0-9a-fA-F]{4,}")  # a repr's memory address
    assert not address.search(text) and "of z" not in text and "hidden=(8,)" in text and "hidden=(32,)" in text
    drawn = browser.execute_script(LEGENDS)
    assert drawn["inside"] == 0 and drawn["outside"] >= 2, drawn  # legends under the plots
    assert not any("of z" in t_ or "Replicas" in t_ or "Spread" in t_ for t_ in drawn["titles"]), drawn["titles"]
    assert not any(address.search(label) for label in drawn["labels"])
    assert any("hidden=(32,)" in label for label in drawn["labels"]), drawn["labels"]
    screenshot(browser, "dashboard-training-loop.png")
