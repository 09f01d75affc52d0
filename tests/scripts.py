"""The training scripts in the repository root, loaded as modules for in-process tests, and
the processes the tests start beside them."""

import contextlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import training.run
from training.metrics import MetricsLogger

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """`name`.py is a script in the repository root, not a package module: load it by path
    (registered under its name, as dataclasses need of the module that defines one)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def script_env() -> dict[str, str]:
    """The environment of a training script run as a subprocess: one OpenMP thread (tests run
    side by side), and this directory on the import path (its fake envs) before the caller's."""
    path = os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)


def record_closing(monkeypatch) -> list[str]:
    """Makes the metrics logger and a training run's process group (`training.run.start_run`)
    note when they are closed (in the list returned); the logger notes its W&B exit code."""
    closed = []
    monkeypatch.setattr(
        training.run, "cleanup_distributed", lambda *exc_info: closed.append("process group")
    )
    monkeypatch.setattr(
        MetricsLogger, "close", lambda self, exit_code=0: closed.append(f"logger {exit_code}")
    )
    return closed


@contextlib.contextmanager
def claimed_by_another_process(run_dir: Path) -> Iterator[subprocess.Popen]:
    """A Python process that holds the claim on ``run_dir`` (`training.run_dir.claim_run_dir`)
    while the block runs, and is killed after it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from training.run_dir import claim_run_dir; claim_run_dir({str(run_dir)!r}); "
            "print('claimed', flush=True); import time; time.sleep(300)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "claimed"
        yield holder
    finally:
        holder.kill()
        holder.wait()
