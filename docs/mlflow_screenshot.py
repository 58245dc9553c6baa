"""The screenshot of docs/guide/tracking.md: a real exploration in MLflow's UI, with headless Chromium.

    python docs/mlflow_screenshot.py             # -> docs/_static/screenshots/mlflow-exploration.png

Starts ``mlflow server`` (SQLite and artifacts in a temporary directory, a free loopback port),
runs a small exploration with ``tracking=`` on an embedded LocalCluster (an SGD classifier on the
digits, three learning rates x two penalties, trained epoch by epoch with ``halving`` pruning),
opens the experiment's runs in headless Chromium (selenium; ``/usr/bin/chromium``,
``/usr/bin/chromedriver``), expands the exploration's parent run to show its branches, saves the
PNG (kept under 300 KB) and stops the server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "_static" / "screenshots" / "mlflow-exploration.png"
MAX_BYTES = 300_000
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--hide-scrollbars")


def digits() -> tuple:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    return train_test_split(X / 16.0, y, test_size=0.3, random_state=0)


def sgd(data: tuple, alpha: float, penalty: str, epochs: int = 9):
    """An SGD classifier trained epoch by epoch: each epoch reports its accuracy (an iterative step)."""
    import numpy as np
    from sklearn.linear_model import SGDClassifier

    X_train, X_test, y_train, y_test = data
    model = SGDClassifier(alpha=alpha, penalty=penalty, random_state=0)
    for epoch in range(1, epochs + 1):
        model.partial_fit(X_train, y_train, classes=np.arange(10))
        yield {"accuracy": float(model.score(X_test, y_test)), "epoch": epoch}
    return {"model": model, "accuracy": float(model.score(X_test, y_test))}


def start_server(root: Path) -> tuple:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    uri = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 180
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return proc, uri
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("mlflow server did not start within 180 s")


def explore(uri: str) -> str:
    """Run the exploration with ``tracking=``; the experiment's id."""
    import mlflow

    from pipelines import Pipeline, grid, halving
    from pipelines.tracking import MLflow

    node = (Pipeline("digits-sgd").source(digits)
            .explore("sgd", grid(sgd, alpha=[1e-4, 1e-3, 1e-2], penalty=["l2", "l1"]))
            .choose("accuracy", prune=halving(factor=3)))
    result = node.run(workers=2, progress=False, tracking=MLflow(uri, experiment="digits-sgd"))
    print(result.table[["sgd.alpha", "sgd.penalty", "accuracy", "iterations", "status", "chosen"]].to_string())
    return mlflow.MlflowClient(uri).get_experiment_by_name("digits-sgd").experiment_id


def shoot(url: str, target: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in FLAGS + ("--window-size=1500,820", f"--user-data-dir={tempfile.mkdtemp(prefix='quiver-mlflow-')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    try:
        driver.get(url)
        time.sleep(8)  # the React app renders
        for el in driver.find_elements(By.XPATH, "//*[normalize-space(text())='Model training']"):
            el.click()  # MLflow 3 opens on its GenAI views: the runs table is under "Model training"
            break
        time.sleep(2)
        driver.get(url)
        time.sleep(6)
        for el in driver.find_elements(By.XPATH, "//button[normalize-space(.)='Got it']"):
            el.click()  # a first-visit tip
        for el in driver.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
            el.click()  # the assistant's panel
        time.sleep(1)
        for el in driver.find_elements(By.CSS_SELECTOR, "button[data-component-id*='runnamecellrenderer']"):
            el.click()  # the exploration's parent run: show its branches
            break
        time.sleep(3)
        target.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(target))
    finally:
        driver.quit()
    if target.stat().st_size > MAX_BYTES:
        from PIL import Image

        Image.open(target).convert("RGB").quantize(128).save(target, optimize=True)


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="quiver-mlflow-server-"))
    proc, uri = start_server(root)
    try:
        experiment = explore(uri)
        shoot(f"{uri}/#/experiments/{experiment}/runs", OUT)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        shutil.rmtree(root, ignore_errors=True)
    print(f"{OUT.relative_to(ROOT)}: {OUT.stat().st_size / 1000:.0f} KB")


if __name__ == "__main__":
    main()
