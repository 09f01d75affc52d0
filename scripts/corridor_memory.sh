#!/usr/bin/env bash
# The paper's figure 4 (left) on held-out seeds: success against average memory size on the
# full Corridor, one point per run: Transformer-XL at spans 10, 20, 50, 100, 200 and Expire-Span
# (L = 200), all with the default preset, 3M steps each (docs/results.md, "Memory against
# success"). 17 runs, two at a time with one thread each: about 3 hours on 2 cores.
#   bash scripts/corridor_memory.sh [SWEEP_DIR]
# A stopped job continues with its own command and resume=true (docs/sweeps.md).
set -euo pipefail
out=${1:-runs/rl-sweeps/corridor-memory}
jobs=(hydra/launcher=joblib hydra.launcher.n_jobs=2 torch_threads=1)
python train_rl.py -m "${jobs[@]}" memory=transformer_xl memory.max_span=50,200 \
    seed=100,101,102 hydra.sweep.dir="$out/transformer_xl-3-seeds"
python train_rl.py -m "${jobs[@]}" memory=transformer_xl memory.max_span=10,20,100 \
    seed=100,101 hydra.sweep.dir="$out/transformer_xl-2-seeds"
python train_rl.py -m "${jobs[@]}" memory=expire_span seed=100,101,102,103,104 \
    hydra.sweep.dir="$out/expire_span"
python -m analysis.plot "$out" --out docs/results/corridor_memory --markdown
