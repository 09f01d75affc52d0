"""A trained agent or model as a small file of its own: `python -m training.export SOURCE DEST`.

SOURCE is a run directory (its checkpoint.pt) or a checkpoint file (e.g. RUN_DIR/best.pt);
DEST gets only what `mode=eval checkpoint=DEST` reads: the weights ("agent" of train_rl.py,
"model" of train_lm.py, with the vocabulary and task base train_lm.py's evaluation reads
too), the resolved config, the step and where the weights came from. The optimizer, the
carried memory, the environments and the generators that a resume needs are left out, so the
file is a fraction of a checkpoint's size and evaluates exactly as its source does.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.checkpoint import checkpoint_file, load_checkpoint, save_checkpoint
from training.config import ConfigError, exit_on_config_error

WEIGHTS = {"agent": "train_rl.py", "model": "train_lm.py"}
EVALUATION_KEYS = ("config", "step", "vocab", "started_in")  # what evaluation reads beside them


def export_trained(source: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Writes DEST (atomically, with its digest) from the checkpoint SOURCE names; returns
    its path. A missing source, one without weights or a DEST in no directory is a
    ConfigError."""
    checkpoint = load_checkpoint(source)
    if checkpoint is None:
        raise ConfigError(f"{source}: no checkpoint there (a checkpoint file or a run directory)")
    key = next((key for key in WEIGHTS if key in checkpoint), None)
    if key is None:
        raise ConfigError(
            f"{source} holds neither 'agent' nor 'model': not a checkpoint of "
            f"{' or '.join(WEIGHTS.values())}"
        )
    dest = Path(dest)
    if not dest.parent.is_dir():
        raise ConfigError(f"{dest}: its directory {dest.parent} does not exist")
    if dest.is_dir():
        raise ConfigError(f"{dest} is a directory: give the file to write, e.g. {dest}/agent.pt")
    exported: dict[str, Any] = {key: checkpoint[key]}
    exported.update((name, checkpoint[name]) for name in EVALUATION_KEYS if name in checkpoint)
    origin = {"file": str(checkpoint_file(source)), "best": checkpoint.get("best")}
    exported["exported_from"] = origin  # (best: the source's best interval, if it kept one)
    return save_checkpoint(dest.parent, exported, filename=dest.name)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.export", description=__doc__.split("\n")[0]
    )
    parser.add_argument("source", type=Path, help="a run directory or a checkpoint file")
    parser.add_argument("dest", type=Path, help="the file to write")
    args = parser.parse_args(argv)
    path = export_trained(args.source, args.dest)
    print(f"{path}: {path.stat().st_size:,} bytes from {checkpoint_file(args.source)}")


if __name__ == "__main__":
    exit_on_config_error(main)()
