#!/usr/bin/env bash
# Time to a result on one GPU (issue: the full Corridor in a minute): candidate settings of the
# default learner on the full Corridor, started together on the GPU on a tuning seed, each for
# WALL seconds; GPU utilisation sampled each second beside them. Figures: steps and updates to
# the first success >= 0.95 from each run's metrics.jsonl (its logged sps is shared with the
# other runs; the setting's rate alone is benchmarks/update_profile.py's).
#   bash scripts/gpu_corridor.sh OUT_DIR [WALL] [SEED]
set -uo pipefail
out=$1 wall=${2:-300} seed=${3:-0}
mkdir -p "$out"
common=(device=cuda torch_threads=3 "seed=$seed" log_interval=1 checkpoint_interval=1000
    eval.after_training=false wandb.mode=disabled)
declare -A candidates=(
    [e1024-m4]="num_envs=1024 agent.minibatches=4 total_steps=20000000"
    [e1024-m4-lr1e-3]="num_envs=1024 agent.minibatches=4 agent.lr=1e-3 total_steps=20000000"
    [e1024-m16]="num_envs=1024 agent.minibatches=16 total_steps=20000000"
    [e256-m4]="num_envs=256 agent.minibatches=4 total_steps=5000000"
)
nvidia-smi dmon -s u -d 1 >"$out/gpu_utilisation.txt" 2>&1 &
monitor=$!
for name in "${!candidates[@]}"; do
    # shellcheck disable=SC2086  # (the candidate's overrides are words)
    timeout "$wall" python train_rl.py ${candidates[$name]} "${common[@]}" \
        "hydra.run.dir=$out/$name-seed$seed" >"$out/$name-seed$seed.log" 2>&1 &
done
wait $(jobs -p | grep -v "^$monitor$")
kill "$monitor"
