#!/usr/bin/env bash
# The paper's table 7 at a CPU scale (docs/results.md, "Easy collision"): the easy collision
# task (A.3.3, `task.hard=false`) on a 5 x 5 grid, the smallest where the last collision is
# usually beyond the 18 steps a block's relative positions reach (a median of 25 steps back,
# 90th percentile 88; the third-last, which "?recent" questions need, a median of 96):
# Transformer-XL at L = 256 (with its block it sees about 72% of the last collisions and 14%
# of the third-last) against Expire-Span at L = 256, 512 and 1024 (up to 97% and 79%), seeds
# 200-202, the small model of configs/lm.yaml, 3,000 updates each (Transformer-XL at L = 512
# erred 0.708 on seed 0's test split, constant answer 0.768; scripts/lm_tuning.sh). LANES at
# a time with one thread each.
#   bash scripts/collision_easy.sh [LANES] [RUNS]
#   python -m analysis.plot docs/results/collision_easy --out docs/results/collision_easy --markdown
#   python -m analysis.collision_probe RUNS/NAME     # which questions a model misses, by age
# Runs go to RUNS (runs/lm-sweeps/collision-easy), each finished one's files to
# docs/results/collision_easy/NAME (scripts/lanes.sh: the same command carries on).
set -euo pipefail
source "$(dirname "$0")/lanes.sh"

names=()
for seed in 200 201 202; do
    for run in transformer_xl-256 expire_span-256 expire_span-512 expire_span-1024; do
        names+=("g5-$run-$seed")
    done
done

run_args() {  # NAME -> its overrides
    local grid memory span seed
    IFS=- read -r grid memory span seed <<<"$1"
    echo "train_lm.py task=collision task.hard=false task.grid_size=${grid#g}" \
        "memory=$memory memory.max_span=$span seed=$seed total_steps=3000" \
        "log_interval=50 eval_interval=250 checkpoint_interval=250"
}

run_lanes "${1:-1}" "${2:-runs/lm-sweeps/collision-easy}" docs/results/collision_easy
