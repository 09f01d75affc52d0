#!/usr/bin/env bash
# Time to a result on one GPU (issue: the full Corridor in a minute): candidate settings of the
# default learner on the full Corridor, started together on the GPU on tuning seeds, each for
# WALL seconds; GPU utilisation sampled each second beside them. Figures: steps and updates to
# the first success >= 0.95 from each run's metrics.jsonl (its logged sps is shared with the
# other runs; the setting's rate alone is benchmarks/update_profile.py's). The candidates: of
# 2026-11-28's four on seed 0 (docs/performance.md, "On a GPU"), the one that reached 0.95
# soonest (16 minibatches) and one between it and the other that reached it (4 minibatches at
# lr 1e-3); four runs together filled an H200.
#   bash scripts/gpu_corridor.sh OUT_DIR [WALL] [SEED ...]
set -uo pipefail
out=$1 wall=${2:-300}
seeds=("${@:3}")
((${#seeds[@]})) || seeds=(1 2)
mkdir -p "$out"
common=(device=cuda torch_threads=3 log_interval=1 checkpoint_interval=1000
    eval.after_training=false wandb.mode=disabled total_steps=20000000)
declare -A candidates=(
    [e1024-m16]="num_envs=1024 agent.minibatches=16"
    [e1024-m8-lr1e-3]="num_envs=1024 agent.minibatches=8 agent.lr=1e-3"
)
nvidia-smi dmon -s u -d 1 >"$out/gpu_utilisation.txt" 2>&1 &
monitor=$!
for seed in "${seeds[@]}"; do
    for name in "${!candidates[@]}"; do
        # shellcheck disable=SC2086  # (the candidate's overrides are words)
        timeout "$wall" python train_rl.py ${candidates[$name]} "${common[@]}" "seed=$seed" \
            "hydra.run.dir=$out/$name-seed$seed" >"$out/$name-seed$seed.log" 2>&1 &
    done
done
wait $(jobs -p | grep -v "^$monitor$")
kill "$monitor"
