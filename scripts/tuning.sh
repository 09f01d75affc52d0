#!/usr/bin/env bash
# Every memory of the suite tuned alike, on tuning seeds only (docs/results.md, "Tuning the
# suite's memories"): PPO epochs 4 or 8 x a constant or annealed rate, for Expire-Span,
# Transformer-XL, the GRU and the LSTM, on POPGym's RepeatPreviousEasy and MiniGrid's
# MemoryS13Random, seeds 0-2, at the suite's budget (configs/sweep/suite.yaml: 1M steps):
# 96 runs, LANES at a time with one thread each (about 11 hours of one core).
#   bash scripts/tuning.sh [LANES] [RUNS]
#   python -m analysis.tuning docs/results/tuning [--write configs/tuned]
# Runs go to RUNS (runs/rl-sweeps/tuning), each finished one's files to docs/results/tuning/NAME
# (scripts/lanes.sh: the same command carries on a stopped queue).
set -euo pipefail
source "$(dirname "$0")/lanes.sh"

names=()
for seed in 0 1 2; do
    for task in repeat_previous_easy memory_s13_random; do
        for memory in expire_span transformer_xl gru lstm; do
            for epochs in 4 8; do
                for schedule in constant linear; do
                    names+=("$task-$memory-e$epochs-$schedule-$seed")
                done
            done
        done
    done
done

run_args() {  # NAME -> its overrides
    local task memory epochs schedule seed
    IFS=- read -r task memory epochs schedule seed <<<"$1"
    echo "train_rl.py +sweep=suite +benchmark=$task memory=$memory agent.epochs=${epochs#e}" \
        "agent.lr_schedule=$schedule seed=$seed"
}

run_lanes "${1:-2}" "${2:-runs/rl-sweeps/tuning}" docs/results/tuning
