#!/usr/bin/env bash
# Choosing the scale of the language-model comparisons on the tuning seed (docs/results.md,
# "Language models"). Easy collision: Transformer-XL at L = 512 on a 6 x 6 grid, on a 4 x 4
# grid (where collisions are dense: does the model find one at all?) and on a 5 x 5 grid (the
# smallest where the last collision is usually beyond a block's relative positions); on 5 x 5,
# Expire-Span at L = 1024 with the task's settings, and with spans from 40% of L and no span
# loss (the best on the instruction task so far). The instruction task at a mean distance of
# four times what a block's relative positions reach (256 with blocks of 64, `k64`):
# Transformer-XL reaching past the distance and short of it, Expire-Span with its spans
# starting at 10% of L (the default) and at 40%, past the distance, with the task's span loss
# (alpha = 2e-6), a tenth of it and none; at 512 with blocks of 128, whether Transformer-XL
# reaching past the distance learns at all. The small model of configs/lm.yaml, 3,000 updates
# each unless a name says (`u6000`, `u1500`), seed 0; LANES at a time with one thread each.
#   bash scripts/lm_tuning.sh [LANES] [RUNS]
#   python -m analysis.plot docs/results/lm_tuning --out docs/results/lm_tuning --markdown
# Runs go to RUNS (runs/lm-sweeps/tuning), each finished one's files to docs/results/lm_tuning/
# NAME (scripts/lanes.sh: the same command carries on a stopped queue).
set -euo pipefail
source "$(dirname "$0")/lanes.sh"

names=(
    instruction-d256k64-transformer_xl-512-0
    collision_easy-g6-transformer_xl-512-0
    instruction-d256k64u6000-transformer_xl-512-0
    collision_easy-g4u1500-transformer_xl-512-0
    instruction-d256k64-expire_span-1024-0
    collision_easy-g5-transformer_xl-512-0
    instruction-d256k64-expire_span-1024-0-s40
    instruction-d256k64-expire_span-1024-0-s40a0
    instruction-d256k64-expire_span-1024-0-s40a2e7
    instruction-d256k64-transformer_xl-128-0
    collision_easy-g5-expire_span-1024-0
    collision_easy-g5-expire_span-1024-0-s40a2e7
    instruction-d512-transformer_xl-1024-0
)

run_args() {  # NAME -> its overrides; size: d<distance>[k<block>][u<updates>] or g<grid>;
    # a last field, if any, names a variant of Expire-Span's defaults (below)
    local task size memory span seed variant distance block="" updates=3000
    IFS=- read -r task size memory span seed variant <<<"$1"
    if [[ $size == *u* ]]; then
        updates=${size#*u}
        size=${size%u*}
    fi
    local common="memory=$memory memory.max_span=$span seed=$seed total_steps=$updates"
    common+=" log_interval=50 eval_interval=250 checkpoint_interval=250"
    case $variant in
        s40) common+=" memory.init_span_fraction=0.4" ;;  # spans start past the distance
        s40a0) common+=" memory.init_span_fraction=0.4 memory.aux_loss_coef=0" ;;  # and no span loss
        s40a2e7) common+=" memory.init_span_fraction=0.4 memory.aux_loss_coef=2e-7" ;;  # alpha / 10
    esac
    case $task in
        instruction)
            distance=${size#d}
            if [[ $distance == *k* ]]; then
                block=" memory.block_len=${distance#*k}"
                distance=${distance%k*}
            fi
            echo "train_lm.py task=instruction task.mean_distance=$distance$block $common" ;;
        collision_easy)
            echo "train_lm.py task=collision task.hard=false task.grid_size=${size#g} $common" ;;
    esac
}

run_lanes "${1:-1}" "${2:-runs/lm-sweeps/tuning}" docs/results/lm_tuning
