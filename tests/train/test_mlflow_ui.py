"""The MLflow UI as a researcher opens it (issue 29), in a real headless Chromium against the real
tracking server: two short runs that differ in one factor (the attention op), then the printed
experiment link and the home link. Checked: model-training mode (no GenAI overview), the headline
charts first and in order, the varied factor and the headline values as runs-table columns, the
α₁ heat map as an image chart. Screenshots go to $SINKLAB_UI_SHOTS (default: the test's tmp dir).

Chromium is Debian's (`apt-get install chromium chromium-driver`, done by `make test` where
missing); the Python driver is selenium (setup.cfg's dev extra)."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from conftest import fit_in_process
from mlflow.tracking import MlflowClient

from pipeline.tracking import views
from pipeline.tracking.images import logged_image_keys
from train_datasets import make_dataset

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
EXPERIMENT = "ui-compare"
pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and DRIVER.exists()),
                                reason="no /usr/bin/chromium + /usr/bin/chromedriver "
                                       "(apt-get install chromium chromium-driver; `make test` does it)")


@pytest.fixture(scope="module")
def two_runs(mlflow_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    ds = make_dataset(root / "ds")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SINKLAB_CACHE", str(root / "cache"))
        mp.chdir(root)
        for op in ("softmax", "sigmoid"):
            args = ["--data.path", str(ds), "--run-dir", str(root / op), "--trainer.max_steps", "4",
                    "--run.experiment", EXPERIMENT, "--run.name", f"op-{op}", "--run.sink_every", "2",
                    "--run.plot_every", "2", "--run.val_every", "2", "--run.system_metrics", "false",
                    "--run.log_model", "false", "--model.model.attention.op", op]
            assert fit_in_process(args, mp, mlflow_server) == 0
            out[op] = (root / op / "mlflow_run_id").read_text().strip()
    return out


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="sinklab-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=opts)
    # the page itself 1600 x 1000, as the check asks
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver, predicate, what: str, timeout: float = 30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what} did not appear in {timeout:.0f} s; page text: {driver.find_element('tag name', 'body').text[:1500]}")


def close_assistant(driver) -> None:
    """MLflow's assistant panel opens by itself on the first visit from localhost; a user closes it once."""
    driver.execute_script("localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
                          "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');")


def chart_titles(driver) -> list[str]:
    """Titles of the chart cards on the page, top to bottom, left to right."""
    return driver.execute_script("""
        const cards = [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]')];
        return cards.map(c => {
            const r = c.getBoundingClientRect();
            const t = c.querySelector('[data-testid="experiment-view-compare-runs-card-title"]') || c;
            return [Math.round(r.top), Math.round(r.left), (t.title || t.innerText || '').split('\\n')[0].trim(),
                    r.bottom <= window.innerHeight];
        }).filter(x => x[2]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);""")


def shots_dir(tmp_path) -> Path:
    path = Path(os.environ.get("SINKLAB_UI_SHOTS") or tmp_path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_the_printed_link_opens_training_charts_headline_first(two_runs, mlflow_server, browser, tmp_path):
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name(EXPERIMENT)
    envelope = json.loads(exp.tags[views.VIEW_TAG])
    state = json.loads(envelope["state"])
    assert "params.`model.model.attention.op`" in state["selectedColumns"]  # the one factor that differs
    assert logged_image_keys(client, two_runs["sigmoid"])[views.ALPHA1_IMAGE] == [0, 2, 4]
    metrics = client.get_run(two_runs["sigmoid"]).data.metrics
    assert not any(re.fullmatch(r"heads/alpha1_l\d+_h\d+", k) for k in metrics)  # images, not 4 x L x H charts

    shots = shots_dir(tmp_path)
    browser.get(views.home_url(mlflow_server))
    close_assistant(browser)
    url = views.experiment_url(mlflow_server, exp.experiment_id)
    browser.get(url)
    browser.refresh()
    titles = wait_for(browser, lambda: len(chart_titles(browser)) >= 5 and chart_titles(browser), "the chart cards")
    time.sleep(2)  # the curves and images load after the cards
    browser.save_screenshot(str(shots / "mlflow-ui-experiment.png"))
    body = browser.find_element("tag name", "body").text
    assert "Model training" in body and "Detect Issues" not in body and "You're viewing a shared view" in body
    names = [t[2] for t in chart_titles(browser)]
    assert names[:4] == [views.HEADLINE_TITLES[m] for m in views.HEADLINE], names
    first_row = chart_titles(browser)[:4]
    assert len({top for top, *_ in first_row}) == 1 and all(visible for *_, visible in first_row), first_row
    assert names[4] == views.ALPHA1_IMAGE  # the heat map right under them
    assert browser.find_elements("css selector", "img[src*='heads~alpha1']"), "no α₁ image shown"

    browser.find_element("css selector", "[data-testid='experiment-view-compare-runs-mode-table'], "
                                         "[aria-label='Table view'], button[value='TABLE']").click()
    headers = wait_for(browser, lambda: "attention.op" in browser.find_element("tag name", "body").text
                       and browser.find_element("tag name", "body").text, "the runs table's op column")
    browser.save_screenshot(str(shots / "mlflow-ui-table.png"))
    for column in ("sinklab.variant", "sink/sink1", "sink/alpha1_mean", "val/loss"):
        assert column in headers, column


def test_the_home_link_opens_on_training_runs(two_runs, mlflow_server, browser, tmp_path):
    browser.get(views.home_url(mlflow_server))
    wait_for(browser, lambda: EXPERIMENT in browser.find_element("tag name", "body").text, "the experiment list")
    browser.save_screenshot(str(shots_dir(tmp_path) / "mlflow-ui-home.png"))
    toggle = browser.execute_script(
        "return [...document.querySelectorAll('[aria-pressed=\"true\"], [aria-checked=\"true\"], [data-state=\"on\"]')]"
        ".map(e => e.innerText.trim()).filter(Boolean);")
    assert "Model training" in toggle and "GenAI" not in toggle, toggle
