"""Step checkpoints in MLflow (``--run.log_checkpoints true``), and ``sinklab fit --resume runs:/<run_id>``,
which continues a run from them on another machine (docs/training.md, "Resume")."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pipeline.checkpoint import CKPT_RE, RunDir, RunDirError
from sinklab_io.atomic import publish
from sinklab_io.notices import warn, why

from .contract import TAG_RUN_DIR

ARTIFACT_DIR = "checkpoints"


class CheckpointUploader:
    def __init__(self, tracking_uri: str, run_id: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client, self.run_id = MlflowClient(tracking_uri), run_id
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sinklab-ckpt-upload")
        self.pending: list[Future] = []
        self.cannot_delete = False

    def upload(self, path: Path, keep: set[str]) -> None:
        """Queue ``path`` and, after it, the deletion of logged checkpoints not in ``keep``."""
        self.pending.append(self.pool.submit(self._upload, Path(path), set(keep)))

    def _upload(self, path: Path, keep: set[str]) -> None:
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path=f"{ARTIFACT_DIR}/{path.name}")
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path=ARTIFACT_DIR)
        for name in set(logged_checkpoints(self.client, self.run_id)) - keep - {path.name}:
            self._delete(f"{ARTIFACT_DIR}/{name}")

    def _delete(self, artifact_path: str) -> None:
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        try:
            get_artifact_repository(self.client.get_run(self.run_id).info.artifact_uri).delete_artifacts(artifact_path)
        except Exception as exc:  # noqa: BLE001 - some stores cannot delete: keep it, say so once
            if not self.cannot_delete:
                self.cannot_delete = True
                warn("fit", f"pruned checkpoints stay in MLflow ({type(exc).__name__}: {str(exc)[:150]})")

    def close(self) -> None:
        """Wait for the queued uploads (the end of fit); a failed one costs a warning."""
        started = time.perf_counter()
        for job in self.pending:
            try:
                job.result()
            except Exception as exc:  # noqa: BLE001 - the checkpoint is on disk; MLflow may be away
                warn("fit", f"a checkpoint was not uploaded to MLflow ({why(exc)})")
        self.pool.shutdown(wait=True)
        if self.pending:
            print(
                f"sinklab: {len(self.pending)} checkpoint upload(s) to MLflow done "
                f"(waited {time.perf_counter() - started:.1f} s at the end)",
                flush=True,
            )
        self.pending = []


def logged_checkpoints(client, run_id: str) -> list[str]:
    names = [Path(a.path).name for a in client.list_artifacts(run_id, ARTIFACT_DIR)]
    return sorted((n for n in names if CKPT_RE.match(n)), key=lambda n: int(CKPT_RE.match(n).group(1)))


def default_run_dir(client, run_id: str) -> Path:
    """``runs/<run name>`` (the name's own sub-directories kept, e.g. a sweep's), else runs/<id>."""
    name = client.get_run(run_id).info.run_name or ""
    safe = name and re.fullmatch(r"[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*", name) and ".." not in name.split("/")
    return Path("runs") / (name if safe else run_id)


def pulled_argv(argv: list[str]) -> list[str]:
    """``--resume runs:/<id>`` as ``--config <run dir>/config.yaml ... --run-dir <run dir> --resume auto``,
    once rank 0 has fetched the run's config and newest logged checkpoint there."""
    from .contract import tracking_uri

    at = next((i for i, a in enumerate(argv) if a == "--resume" or a.startswith("--resume=")), None)
    if at is None:
        return argv
    inline = "=" in argv[at]
    spec = argv[at].split("=", 1)[1] if inline else (argv[at + 1] if at + 1 < len(argv) else "")
    if not spec.startswith("runs:/"):
        return argv
    rest = argv[:at] + argv[at + (1 if inline else 2) :]
    wanted = next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--run-dir"), None)
    rank = int(os.environ.get("SLURM_PROCID") or os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or 0)
    root = pull_run(spec, Path(wanted) if wanted else None, tracking_uri(), download=rank == 0)
    if rank == 0:
        print(f"sinklab fit: {spec}: continuing in {root} from its newest logged checkpoint", flush=True)
    while not (root / "mlflow_run_id").exists():  # another rank is downloading
        time.sleep(2)
    if not any(a == "--config" or a.startswith("--config=") for a in rest):
        rest = ["--config", str(root / "config.yaml"), *rest]
    return rest + ["--run-dir", str(root), "--resume", "auto"]


def pull_run(spec: str, run_dir: Path | None, tracking_uri: str, download: bool = True) -> Path:
    """Download what ``--resume runs:/<run_id>`` continues from; returns the local run dir."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    m = re.fullmatch(r"runs:/([0-9A-Za-z_-]+)/?", spec)
    if not m:
        raise RunDirError(f"--resume {spec}: expected runs:/<run_id>")
    run_id, client = m.group(1), MlflowClient(tracking_uri)
    try:
        names = logged_checkpoints(client, run_id)
        run = RunDir(run_dir or default_run_dir(client, run_id))
    except MlflowException as exc:
        raise RunDirError(
            f"--resume {spec}: no such run in the MLflow store at {tracking_uri} ({exc.message[:150]})"
        ) from None
    if not names:
        raise RunDirError(
            f"--resume {spec}: the run logged no checkpoint; runs log them with "
            "--run.log_checkpoints true (continue it where its run directory is, with --resume auto)"
        )
    known = run.mlflow_run_id()
    if known not in (None, run_id):
        raise RunDirError(f"--resume {spec}: {run.root} belongs to MLflow run {known}; choose another --run-dir")
    if not download:
        return run.root
    run.create()
    for artifact, target in (
        ("config/config.yaml", run.root / "config.yaml"),
        (f"{ARTIFACT_DIR}/{names[-1]}", run.checkpoints / names[-1]),
    ):
        if not target.exists():  # the file or folder whole, or not at all
            publish(target, lambda tmp, artifact=artifact: Path(client.download_artifacts(run_id, artifact, str(tmp))))
    run.save_mlflow_run_id(run_id)
    client.set_tag(run_id, TAG_RUN_DIR, str(run.root.resolve()))  # the run continues from here now, not as a copy
    return run.root
