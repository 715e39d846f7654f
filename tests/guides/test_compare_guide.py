"""docs/guides/compare.md, run as written against the suite's MLflow server: four 4-step runs (two weight
decays under two seeds), the page's `sinklab ui`, then its printed link in headless Chromium: the
screenshots the page shows, each checked for the charts or columns it names. SINKLAB_GUIDE_SHOTS=DIR
writes them there (docs/images for the page)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from fit_runs import fit_in_process, lean_tracking, paths
from guide_runner import DOCS, GuideShell, guide_env, run_guide
from packed_datasets import make_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracking"))
from test_mlflow_ui import (  # noqa: E402  the UI test's browser and page readers
    _SCROLL_TO_LAST_CARD,
    CHROMIUM,
    DRIVER,
    body_text,
    browser,  # noqa: F401  a fixture
    chart_cards,
    close_assistant,
    wait_for,
)

from pipeline.tracking import views  # noqa: E402

EXPERIMENT, SWEEP = "weight-decay-demo", "weight-decay-seeds"
pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and DRIVER.exists()), reason="no /usr/bin/chromium")


def train_runs(server: str, root: Path) -> None:
    """Two weight decays in one experiment (with α₁ maps), and the same two under two seeds each in another."""
    ds = make_dataset(root / "ds")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SINKLAB_CACHE", str(root / "cache"))
        mp.chdir(root)
        for experiment, wd, seed in [(EXPERIMENT, wd, 1) for wd in ("0.0", "0.5")] + [
            (SWEEP, wd, seed) for wd in ("0.0", "0.5") for seed in (1, 2)
        ]:
            name = f"wd-{wd}-s{seed}"
            args = [*paths(ds, root / experiment / name), "--trainer.max_steps", "4", "--run.experiment", experiment]
            args += ["--run.name", name, "--run.variant", f"wd-{wd}", "--seed_everything", str(seed)]
            plots = "2" if experiment == EXPERIMENT else "0"  # grouped runs show no α₁ maps
            args += ["--optim.weight_decay", wd, "--run.sink_every", "2", "--run.plot_every", plots]
            args += ["--run.val_every", "2", *lean_tracking()]
            assert fit_in_process(args, mp, server) == 0


def test_compare_guide_runs_as_written(mlflow_server, browser, tmp_path):  # noqa: F811
    train_runs(mlflow_server, tmp_path)
    shell = GuideShell(tmp_path, guide_env(tmp_path / "home", tmp_path / "bin", uri=mlflow_server))
    try:
        run_guide("compare.md", shell)
    finally:
        shell.close()
    printed = shell.log[-1][2]
    link, sweep = (re.search(rf"^  {name}: (\S+)$", printed, re.M).group(1) for name in (EXPERIMENT, SWEEP))
    assert link.endswith(f"viewStateShareKey={views.SHARED_VIEW_KEY}")

    shots = Path(os.environ.get("SINKLAB_GUIDE_SHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    named = set(re.findall(r"\]\(\.\./images/(compare-[\w-]+\.png)\)", (DOCS / "compare.md").read_text()))
    taken = set()

    browser.get(views.home_url(mlflow_server))
    close_assistant(browser)
    browser.get(link)
    browser.refresh()
    headline = list(views.HEADLINE)
    wait_for(browser, lambda: [c[3] for c in chart_cards(browser)][:4] == headline, "the headline row")
    assert views.VIEW_NAME in body_text(browser)
    browser.save_screenshot(str(shots / "compare-first-screen.png"))
    taken.add("compare-first-screen.png")

    def alpha1_maps() -> bool:
        browser.execute_script(_SCROLL_TO_LAST_CARD)  # the UI draws the cards in view only
        return any(c[3] == views.ALPHA1_IMAGE and c[4] for c in chart_cards(browser))

    wait_for(browser, alpha1_maps, "the α₁ maps")
    slider = browser.execute_script(
        "const c = [...document.querySelectorAll('[data-testid=\"experiment-view-compare-runs-card\"]')]"
        f".find(c => (c.innerText || '').startsWith('{views.ALPHA1_IMAGE}'));"
        "return c.querySelectorAll('[role=slider], input[type=range]').length;"
    )
    assert slider >= 1, "the α₁ card has no step slider"
    browser.save_screenshot(str(shots / "compare-alpha1.png"))
    taken.add("compare-alpha1.png")

    browser.get(link.replace("compareRunsMode=CHART", "compareRunsMode=TABLE"))
    columns = ("sinklab.variant", "optim.weight_decay", "sink/sink1", "sink/alpha1_mean", "val/loss")
    wait_for(browser, lambda: all(c in body_text(browser) for c in columns), "the runs table's columns")
    browser.save_screenshot(str(shots / "compare-table.png"))
    taken.add("compare-table.png")

    browser.get(sweep)
    wait_for(
        browser,
        lambda: all(f"Group: wd-{wd}" in body_text(browser) for wd in ("0.0", "0.5")),
        "the sweep's runs grouped by variant",
    )
    wait_for(browser, lambda: [c[3] for c in chart_cards(browser)][:4] == headline, "the grouped headline row")
    browser.save_screenshot(str(shots / "compare-grouped.png"))
    taken.add("compare-grouped.png")
    assert named == taken, f"the page shows {sorted(named)}, the test takes {sorted(taken)}"
