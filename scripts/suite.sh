#!/usr/bin/env bash
# The memory suite on held-out seeds (docs/results.md, "Memory suite"): 7 tasks x Expire-Span,
# Transformer-XL, the GRU, the LSTM and no memory (mlp) x seeds 200-204, 1M steps, each memory
# at the setting its tuning chose (configs/tuned/); then the three tasks no memory learns at
# 1M again at 10M steps, Expire-Span and the GRU on seeds 200-202. LANES at a time, one thread.
#   bash scripts/suite.sh [LANES] [RUNS]
#   python -m analysis.plot docs/results/suite_heldout --out docs/results/suite_heldout --markdown
# Runs go to RUNS (runs/rl-sweeps/suite-heldout), each finished one's files to
# docs/results/suite_heldout/NAME (scripts/lanes.sh: the same command carries on).
set -euo pipefail
source "$(dirname "$0")/lanes.sh"

for memory in expire_span transformer_xl gru lstm; do
    if [ ! -f "configs/tuned/$memory.yaml" ]; then
        echo "configs/tuned/$memory.yaml is missing: finish scripts/tuning.sh and write the" \
            "choices (python -m analysis.tuning docs/results/tuning --write configs/tuned)" >&2
        exit 2
    fi
done

tasks=(memory_s13_random repeat_previous_easy repeat_first_easy count_recall_easy
    autoencode_easy position_only_cartpole_easy higher_lower_easy)
names=()
for seed in 200 201 202 203 204; do
    for task in "${tasks[@]}"; do
        for memory in expire_span transformer_xl gru lstm mlp; do
            names+=("$task-$memory-1M-$seed")
        done
    done
done
for seed in 200 201 202; do
    for task in autoencode_easy count_recall_easy higher_lower_easy; do
        for memory in expire_span gru; do
            names+=("$task-$memory-10M-$seed")
        done
    done
done

run_args() {  # NAME -> its overrides
    local task memory steps seed
    IFS=- read -r task memory steps seed <<<"$1"
    echo "train_rl.py +sweep=suite +benchmark=$task memory=$memory" \
        "total_steps=${steps%M}000000 seed=$seed"
}

run_lanes "${1:-2}" "${2:-runs/rl-sweeps/suite-heldout}" docs/results/suite_heldout
