"""Figures as MLflow images with steps: the UI's image charts show one key across runs, with a step slider."""

from __future__ import annotations

from pathlib import Path


def log_image_file(client, run_id: str, path: Path, key: str, step: int) -> None:
    """Log the PNG at ``path`` as image ``key`` at ``step`` of the run, synchronously."""
    from PIL import Image

    with Image.open(path) as image:
        client.log_image(run_id, image.convert("RGB"), key=key, step=int(step), synchronous=True)


def logged_image_keys(client, run_id: str) -> dict[str, list[int]]:
    """Image key -> sorted steps of the run's logged images (read back from ``images/``)."""
    found: dict[str, set[int]] = {}
    for item in client.list_artifacts(run_id, "images"):
        name = Path(item.path).name
        if name.endswith(".png"):
            key, _, step, *_ = name.split("+")
            found.setdefault(key.replace("~", "/"), set()).add(int(step))
    return {key: sorted(steps) for key, steps in found.items()}
