"""Screenshots of the site and of a Result in Jupyter, with a real headless Chromium (selenium).

    make docs                                   # the site, gallery included, in docs/_build/html
    python docs/screenshots.py                  # -> docs/_static/screenshots/*.png
    python docs/screenshots.py --html /tmp/site # another build's output

Writes ``front-page.png`` (the site's index), ``gallery-digits.png`` (the digits example's
gallery page at its output and figures) and ``result-html.png`` (``Result._repr_html_()`` of a
real run of ``examples/digits_explore.py``, in a page styled like a notebook's output cell).
Each PNG is kept under 300 KB (reduced to a 256-colour palette when larger). Needs ``chromium``
and ``chromedriver`` (Debian: ``apt-get install chromium chromium-driver``) and selenium.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "_static" / "screenshots"
MAX_BYTES = 300_000

NOTEBOOK_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Result in Jupyter</title>
<style>body {{ font-family: system-ui, sans-serif; font-size: 13px; margin: 24px; }}
.cell {{ border-left: 3px solid #42a5f5; padding: 4px 12px; }}
.prompt {{ color: #303f9f; font-family: monospace; }} pre {{ margin: 0 0 8px 0; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 8px; text-align: right; }}
tr:nth-child(even) {{ background: #f5f5f5; }}</style></head><body>
<div class="cell"><span class="prompt">In [3]:</span><pre>result = output.run()
result</pre></div>
<div class="cell"><span class="prompt">Out[3]:</span>{html}</div></body></html>"""


def browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if binary is None or shutil.which("chromedriver") is None:
        raise SystemExit("no chromium/chromedriver: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                 f"--window-size={width},{height}", f"--user-data-dir={tempfile.mkdtemp(prefix='quiver-shots-')}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def shoot(driver, url: str, target: Path, scroll_to: str | None = None) -> Path:
    driver.get(url)
    if scroll_to:  # the first element with this CSS selector at the top, below the theme's sticky header
        driver.execute_script("document.querySelector(arguments[0]).scrollIntoView(); window.scrollBy(0, -150)",
                              scroll_to)
    driver.save_screenshot(str(target))
    if target.stat().st_size > MAX_BYTES:
        from PIL import Image

        Image.open(target).convert("RGB").quantize(256).save(target, optimize=True)
    return target


def result_html() -> str:
    """``_repr_html_()`` of a real run of the digits example (an embedded LocalCluster)."""
    import sys

    import cloudpickle

    spec = importlib.util.spec_from_file_location("digits_explore", ROOT / "examples" / "digits_explore.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the workers cannot import examples/
    return module.output.run(progress=False)._repr_html_()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Screenshots of the built site and of a Result's HTML")
    ap.add_argument("--html", default=str(ROOT / "docs" / "_build" / "html"), help="the built site")
    args = ap.parse_args(argv)
    site = Path(args.html).resolve()
    OUT.mkdir(parents=True, exist_ok=True)
    page = Path(tempfile.mkdtemp(prefix="quiver-result-")) / "result.html"
    page.write_text(NOTEBOOK_PAGE.format(html=result_html()), encoding="utf-8")
    driver = browser(1440, 900)
    try:
        shots = [
            shoot(driver, (site / "index.html").as_uri(), OUT / "front-page.png"),
            shoot(driver, (site / "gallery" / "digits_explore.html").as_uri(), OUT / "gallery-digits.png",
                  scroll_to="img[src*='digits_explore_002']"),
            shoot(driver, page.as_uri(), OUT / "result-html.png"),
        ]
    finally:
        driver.quit()
    for shot in shots:
        print(f"{shot.relative_to(ROOT)}: {shot.stat().st_size / 1000:.0f} KB")


if __name__ == "__main__":
    main()
