"""The filters on other libraries' output: each drops the one thing it names, the rest still shows."""

from __future__ import annotations

import logging
import warnings

from sinklab_io.third_party import _Drop, quiet_third_party


def test_each_logger_filter_drops_only_what_it_names():
    quiet_third_party()
    quiet_third_party()  # a second call adds nothing
    names = ("DeepSpeed", "lightning.pytorch.utilities.rank_zero", "mlflow.store.db.utils")
    deepspeed, rank_zero, store = map(logging.getLogger, names)
    kept: list[str] = []
    keep = logging.Handler(logging.DEBUG)
    keep.emit = lambda record: kept.append(record.getMessage())
    level = rank_zero.level
    rank_zero.setLevel(logging.INFO)  # Lightning's own level, whether or not Lightning is imported
    for logger in (deepspeed, rank_zero, store):
        logger.addHandler(keep)
    try:
        deepspeed.warning("Setting accelerator to CPU. If you have GPU or other accelerator, ...")
        deepspeed.warning("Some other DeepSpeed warning")
        rank_zero.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing ...")
        rank_zero.info("GPU available: False, used: False")
        store.info("Creating initial MLflow database tables...")
        store.warning("a store that cannot be written")
    finally:
        for logger in (deepspeed, rank_zero, store):
            logger.removeHandler(keep)
        rank_zero.setLevel(level)
    assert kept == [
        "Some other DeepSpeed warning",
        "GPU available: False, used: False",
        "a store that cannot be written",
    ]
    assert sum(isinstance(f, _Drop) for f in deepspeed.filters) == 1


def test_the_leafspec_deprecation_is_dropped_only_where_lightning_raises_it():
    message = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)` instead."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()
        for module in ("lightning.pytorch.utilities._pytree", "mine"):
            warnings.warn_explicit(message, FutureWarning, f"{module}.py", 21, module=module)
        warnings.warn_explicit(
            "another deprecation", FutureWarning, "x.py", 21, module="lightning.pytorch.utilities._pytree"
        )
    assert [(w.filename, str(w.message)) for w in caught] == [
        ("mine.py", message),
        ("x.py", "another deprecation"),
    ]
