"""The MLflow UI as a researcher opens it, in a real headless Chromium against the real
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
from fit_runs import fit_in_process, lean_tracking, logged_image_keys, paths
from mlflow.tracking import MlflowClient
from packed_datasets import make_dataset

from pipeline import metric_names as N
from pipeline.tracking import views

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
EXPERIMENT = "ui-compare"
pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and DRIVER.exists()),
    reason="no /usr/bin/chromium + /usr/bin/chromedriver "
    "(apt-get install chromium chromium-driver; `make test` does it)",
)


@pytest.fixture(scope="module")
def two_runs(mlflow_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    ds = make_dataset(root / "ds")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SINKLAB_CACHE", str(root / "cache"))
        mp.chdir(root)
        for op in ("softmax", "sigmoid"):
            args = [
                *paths(ds, root / op),
                "--trainer.max_steps",
                "4",
                "--run.experiment",
                EXPERIMENT,
                "--run.name",
                f"op-{op}",
                "--run.sink_every",
                "2",
                "--run.plot_every",
                "2",
                "--run.val_every",
                "2",
                *lean_tracking(),
                "--arch.attention.op",
                op,
            ]
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
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=opts)
    # the page itself 1600 x 1000, as the check asks
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": False}
    )
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
    raise AssertionError(
        f"{what} did not appear in {timeout:.0f} s; page text: {driver.find_element('tag name', 'body').text[:1500]}"
    )


def close_assistant(driver) -> None:
    """MLflow's assistant panel opens by itself on the first visit from localhost; a user closes it once."""
    driver.execute_script(
        "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
        "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
    )


def chart_cards(driver) -> list[list]:
    """[top, left, bottom, title, images] of each chart card on the page, top to bottom, left to right."""
    return driver.execute_script("""
        return [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]')].map(c => {
            const r = c.getBoundingClientRect();
            return [Math.round(r.top), Math.round(r.left), Math.round(r.bottom), (c.innerText || '').split('\\n')[0].trim(),
                    c.querySelectorAll('img').length];
        }).sort((a, b) => a[0] - b[0] || a[1] - b[1]);""")


_SCROLL_TO_LAST_CARD = """
    const cards = document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]');
    cards[cards.length - 1].scrollIntoView({block: 'start'});"""


def curves_drawn(driver) -> int:
    """How many chart cards show a drawn curve (plotly's trace paths)."""
    return driver.execute_script("""
        return [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]')]
            .filter(c => c.querySelector('.scatterlayer .trace path')).length;""")


def body_text(driver) -> str:
    return driver.find_element("tag name", "body").text


def shots_dir(tmp_path) -> Path:
    path = Path(os.environ.get("SINKLAB_UI_SHOTS") or tmp_path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_the_printed_link_opens_training_charts_headline_first(two_runs, mlflow_server, browser, tmp_path):
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name(EXPERIMENT)
    envelope = json.loads(exp.tags[views.VIEW_TAG])
    state = json.loads(envelope["state"])
    assert "params.`arch.attention.op`" in state["selectedColumns"]  # the one factor that differs
    assert logged_image_keys(client, two_runs["sigmoid"])[views.ALPHA1_IMAGE] == [0, 2, 4]
    metrics = client.get_run(two_runs["sigmoid"]).data.metrics
    assert not any(re.fullmatch(r"heads/alpha1_l\d+_h\d+", k) for k in metrics)  # images, not 4 x L x H charts

    shots = shots_dir(tmp_path)
    browser.get(views.home_url(mlflow_server))
    close_assistant(browser)
    browser.get(views.experiment_url(mlflow_server, exp.experiment_id))
    browser.refresh()
    wait_for(
        browser,
        lambda: sum(card[4] for card in chart_cards(browser)) >= 2 and curves_drawn(browser) >= 4,
        "the curves and the max-logit images",
    )
    browser.save_screenshot(str(shots / "mlflow-ui-experiment.png"))
    body = body_text(browser)
    assert "Model training" in body and "Detect Issues" not in body and views.VIEW_NAME in body
    cards = chart_cards(browser)
    # no spike guard in these runs: the skipped-steps chart has no data and is hidden (hideEmptyCharts)
    stability = [name for name in views.STABILITY if name != N.SKIPPED_STEPS]
    first_screen = [*views.HEADLINE, *stability, views.MAX_LOGIT_IMAGE]
    assert [c[3] for c in cards] == first_screen, cards  # the UI renders the cards in view only
    first_row = cards[:4]
    assert len({c[0] for c in first_row}) == 1 and max(c[2] for c in first_row) <= 1000, first_row  # no scrolling
    browser.execute_script(_SCROLL_TO_LAST_CARD)
    wait_for(
        browser,
        lambda: any(c[3] == views.ALPHA1_IMAGE and c[4] for c in chart_cards(browser)),
        "the α₁ images below the stability row",
    )
    browser.save_screenshot(str(shots / "mlflow-ui-experiment-below.png"))
    below = [c for c in chart_cards(browser) if c[3] not in first_screen]
    assert [c[3] for c in below] == [views.ALPHA1_IMAGE, views.TRAJECTORY_IMAGE], below  # the other sections collapsed
    assert below[0][4] >= 2  # the α₁ map of both runs, side by side in one image chart

    browser.get(
        views.experiment_url(mlflow_server, exp.experiment_id).replace("compareRunsMode=CHART", "compareRunsMode=TABLE")
    )
    headers = wait_for(
        browser,
        lambda: (
            all(text in body_text(browser) for text in ("arch.attention.op", "sigmoid", "softmax"))
            and body_text(browser)
        ),
        "the runs table's op column and its two values",
    )
    browser.save_screenshot(str(shots / "mlflow-ui-table.png"))
    for column in ("sinklab.variant", "sink/sink1", "sink/alpha1_mean", "val/loss"):
        assert column in headers, column
    assert "sigmoid" in headers and "softmax" in headers


def workflow_switch(driver) -> dict[str, str]:
    """The sidebar's GenAI / Model training switch: label -> text colour (the chosen one is darker)."""
    return dict(
        driver.execute_script(
            "return [...document.querySelectorAll('div[role=button]')].filter(e => /^(GenAI|Model training)$/"
            ".test((e.innerText || '').trim())).map(e => [e.innerText.trim(), getComputedStyle(e.firstChild).color]);"
        )
    )


def darkness(rgb: str) -> int:
    return -sum(int(v) for v in re.findall(r"\d+", rgb)[:3])


def test_the_home_link_opens_on_training_runs(two_runs, mlflow_server, browser, tmp_path):
    browser.get(views.home_url(mlflow_server))
    wait_for(browser, lambda: EXPERIMENT in body_text(browser), "the experiment list")
    browser.save_screenshot(str(shots_dir(tmp_path) / "mlflow-ui-home.png"))
    switch = workflow_switch(browser)
    assert darkness(switch["Model training"]) > darkness(switch["GenAI"]), switch
    # MLflow 3.17 keeps the mode of a link followed from here only where the link carries it: the
    # experiment list's links do not, and follow the browser's remembered switch, which one click on
    # "Model training" (on a page opened without the parameter) sets for good (docs/training.md)
    browser.get(views.home_url(mlflow_server).split("?")[0])
    wait_for(browser, lambda: EXPERIMENT in body_text(browser), "the experiment list")
    next(
        b for b in browser.find_elements("css selector", "div[role=button]") if b.text.strip() == "Model training"
    ).click()
    browser.get(views.home_url(mlflow_server).split("?")[0])
    recent = wait_for(
        browser,
        lambda: browser.find_elements(
            "xpath", f"//*[normalize-space()='Recent Experiments']/following::a[normalize-space()='{EXPERIMENT}']"
        ),
        "the recent experiments",
    )
    recent[0].click()
    wait_for(
        browser,
        lambda: "/runs?" in browser.current_url and "matching runs" in body_text(browser),
        f"the runs page (at {browser.current_url})",
    )
    assert "workflowType=machine_learning" in browser.current_url and "Detect Issues" not in body_text(browser)
