#!/usr/bin/env bash
# Installs the project, its dev tools and the extras the tests use (POPGym, video, parallel
# sweeps, statistics; not Slurm) into the current Python environment, at the versions the tests
# were last run against (constraints.txt; UNPINNED=1 takes the newest instead).
# A torch that is already installed is kept; otherwise the CPU-only build is taken
# (set TORCH_SPEC, e.g. TORCH_SPEC=torch, to choose another build).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
    python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
if [ -n "${UNPINNED:-}" ]; then
    python -m pip install --quiet -e ".[dev,popgym,video,sweeps,stats]"
else
    python -m pip install --quiet -e ".[dev,popgym,video,sweeps,stats]" --constraint constraints.txt
fi
