#!/usr/bin/env bash
# The paper's table 7 at a CPU scale (docs/results.md, "Easy collision"): the easy collision
# task (A.3.3, `task.hard=false`) on a 5 x 5 grid, the smallest where the last collision is
# usually beyond the 18 steps a block's relative positions reach (a median of 25 steps back,
# 90th percentile 88; the third-last, which "?recent" questions need, a median of 96):
# Transformer-XL at L = 256 (with its block it sees about 72% of the last collisions and 14%
# of the third-last) against Expire-Span at L = 256, 512 and 1024 (up to 97% and 79%), seeds
# 200-202, the small model of configs/lm.yaml, 3,000 updates each (Transformer-XL at L = 512
# erred 0.708 on seed 0's test split, constant answer 0.768; scripts/lm_tuning.sh). Expire-Span
# starts its spans at 40% of L with alpha = 2e-7, as on the instruction task: on seed 0 at
# L = 1024 it erred 0.700 with a memory of 795, against 0.710 and 610 at the task's
# settings (scripts/lm_tuning.sh). LANES at a time with one thread each.
#   bash scripts/collision_easy.sh [LANES] [RUNS]
#   python -m analysis.plot docs/results/collision_easy --out docs/results/collision_easy --markdown \
#       --metric test_error                         # (table 7: the test split's error)
#   python -m analysis.probes docs/results/collision_easy --file collision_probe_test.json
# Runs go to RUNS (runs/lm-sweeps/collision-easy), each finished one's files to
# docs/results/collision_easy/NAME (scripts/lanes.sh: the same command carries on), with its
# probe of the test split (analysis.collision_probe: which questions a model misses, by how
# far back their collision lies) in collision_probe_test.json.
set -euo pipefail
source "$(dirname "$0")/lanes.sh"

names=()
for seed in 200 201 202; do
    for run in transformer_xl-256 expire_span-256 expire_span-512 expire_span-1024; do
        names+=("g5-$run-$seed")
    done
done

run_args() {  # NAME -> its overrides
    local grid memory span seed start=""
    IFS=- read -r grid memory span seed <<<"$1"
    if [ "$memory" = expire_span ]; then  # (as on the instruction task)
        start=" memory.init_span_fraction=0.4 memory.aux_loss_coef=2e-7"
    fi
    echo "train_lm.py task=collision task.hard=false task.grid_size=${grid#g}" \
        "memory=$memory memory.max_span=$span$start seed=$seed total_steps=3000" \
        "log_interval=50 eval_interval=250 checkpoint_interval=250"
}

after_run() { probe_test_split collision_probe "$@"; }

run_lanes "${1:-1}" "${2:-runs/lm-sweeps/collision-easy}" docs/results/collision_easy
