"""A real single-machine SLURM cluster for tests: munged, slurmctld and two slurmd daemons.

Everything lives in one temporary directory (config, key, socket, state, logs) and is found
through SLURM_CONF, so it never touches a system SLURM. Only the processes started here are
stopped. Two nodes (n1, n2) share this machine; their names do not resolve, so jobs get
MASTER_ADDR=127.0.0.1 (on a real cluster Lightning takes the first host of SLURM_NODELIST).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
BINARIES = ["slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "munged"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name: str) -> str | None:
    """A SLURM/munge program, also where /usr/sbin is not on PATH."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")
    return found


def ensure_installed() -> str | None:
    """Install SLURM and munge with apt when missing; return why it is impossible, or None."""
    if all(binary(b) for b in BINARIES):
        return None
    if os.geteuid() != 0:
        return (
            "SLURM is not installed and installing it needs root (apt-get install slurmctld slurmd slurm-client munge)"
        )
    if not shutil.which("apt-get"):
        return "SLURM is not installed and this system has no apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-300:]}"
    return None


SLURM_CONF = """\
ClusterName=sinklabtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobRequeue=1
SlurmdParameters=config_overrides
MinJobAge=600
KillWait=5
ReturnToService=2
MpiDefault=none
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Each node claims 16 CPUs (config_overrides: more than this machine has) so that a 1-node x 2-task
# job and a 2-node x 1-task job fit at the same time, and a task of `sinklab sweep --submit` (8 CPUs).
{nodes}
PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []
        self.nodes = ["n1", "n2"]
        self._held_since: dict[str, float] = {}
        self.env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"), MASTER_ADDR="127.0.0.1")

    def start(self) -> None:
        root = self.root
        for sub in ("munge", "state", "spool"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(root / "munge", 0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        node_lines = "\n".join(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} "
            "CPUs=16 RealMemory=2000 State=UNKNOWN"
            for name in self.nodes
        )
        (root / "slurm.conf").write_text(
            SLURM_CONF.format(root=root, ctld_port=free_port(), nodes=node_lines, node_list=",".join(self.nodes))
        )
        m = root / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={m}/socket",
                f"--pid-file={m}/pid",
                f"--log-file={m}/log",
                f"--seed-file={m}/seed",
            ],
        )
        self._wait(lambda: (m / "socket").exists(), "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name])
        self._wait(self._all_idle, "both nodes idle in sinfo", timeout=60)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        cmd = [binary(cmd[0]), *cmd[1:]]
        log = open(self.root / f"{name}.out", "w")
        self.logs.append(log)
        self.procs.append(
            subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def _all_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split("\n")
        return sum(line.endswith(" idle") for line in out) == len(self.nodes)

    def _wait(self, ready, what: str, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.time() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.out")))
                raise RuntimeError(f"test SLURM: waiting for {what} failed (exited: {dead})\n{logs}")
            time.sleep(0.2)

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr}")
        return done

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job, e.g. ("PENDING", "BeginTime") or ("COMPLETED", "None")."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
        return fields.get("JobState", "?"), fields.get("Reason", "?")

    def wait_for(self, job_id: str, states: set[str], timeout: float = 150, release_requeued: bool = True) -> str:
        """Wait until the job is in one of `states`; start requeued jobs held for BeginTime at once."""
        deadline = time.time() + timeout
        while True:
            state, reason = self.job_state(job_id)
            if state in states and not self.in_queue(job_id):
                # A job being requeued as it ends can show FAILED (while squeue still lists it
                # as completing) before it is PENDING again: a final state must hold a while.
                time.sleep(2)
                if self.job_state(job_id)[0] == state and not self.in_queue(job_id):
                    return state
                continue
            if release_requeued:
                self.release_requeued(job_id, state, reason)
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} still {state} ({reason}) after {timeout} s")
            time.sleep(0.3)

    def release_requeued(self, job_id: str, state: str, reason: str) -> None:
        """Start a requeued job held for BeginTime (~2 min, the credential lifetime) now, but not
        within 2 s of its requeue: slurmd refuses a credential created in the same second as the
        one it revoked for the old run (whole-second times), and the launch fails."""
        if state != "PENDING" or reason != "BeginTime":
            self._held_since.pop(job_id, None)
        elif time.time() - self._held_since.setdefault(job_id, time.time()) >= 2:
            self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)

    def in_queue(self, job_id: str) -> bool:
        """squeue lists the job: pending, running or still completing (not yet final)."""
        return bool(self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip())

    def wait_for_output(self, job_id: str, text: str, log: Path, timeout: float = 150) -> None:
        """Wait until the job's log holds `text`, starting it at once if it waits on BeginTime."""
        deadline = time.time() + timeout
        while not (log.exists() and text in log.read_text()):
            state, reason = self.job_state(job_id)
            self.release_requeued(job_id, state, reason)
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} ({state}, {reason}) printed no {text!r} in {timeout} s")
            time.sleep(0.3)

    def stop(self) -> None:
        jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if jobs:
            self.run("scancel", *jobs, check=False)
            deadline = time.time() + 15
            while self.run("squeue", "-h", check=False).stdout.strip() and time.time() < deadline:
                time.sleep(0.3)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


@contextlib.contextmanager
def running_cluster(monkeypatch):
    """A started SlurmCluster in a directory of its own (not pytest's numbered temp dirs, which other
    pytest sessions may rotate away while the daemons still use it); SLURM_CONF and MASTER_ADDR set
    through ``monkeypatch`` for sbatch, scontrol and the jobs (which inherit this environment)."""
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="sinklab-slurm-")))
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    monkeypatch.setenv("MASTER_ADDR", cluster.env["MASTER_ADDR"])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
