#!/usr/bin/env bash
# The trained agent a newcomer can evaluate and watch without training one (docs/usage.md,
# "A trained agent to try"): the default Corridor agent (python train_rl.py env=corridor: PPO,
# Expire-Span, 3M steps, about 30 minutes on one core) on SEED (300, which no result uses),
# exported to trained/corridor.pt, and one episode of it acting greedily recorded, with what
# its memory keeps, to docs/results/corridor_episode.gif (the episode of RECORD_SEED: another
# seed, another corridor).
#   bash scripts/trained_agents.sh [SEED] [RECORD_SEED]
# A stopped run continues from its checkpoint (resume=auto) and a finished one is not run
# again; each step prints its command before it runs.
set -euo pipefail
seed=${1:-300}
record_seed=${2:-$seed}
run_dir=runs/trained/corridor-seed$seed

step() {
    echo "+ $*"
    "$@"
}

if [ ! -f "$run_dir/eval.json" ]; then
    step python train_rl.py env=corridor seed="$seed" "hydra.run.dir=$run_dir" torch_threads=1 \
        wandb.mode=disabled resume=auto
fi
mkdir -p trained docs/results
step python -m training.export "$run_dir" trained/corridor.pt
step python train_rl.py mode=eval checkpoint=trained/corridor.pt eval.policy=greedy \
    eval.episodes=1 eval.num_envs=1 seed="$record_seed" \
    eval.record=docs/results/corridor_episode.gif torch_threads=1
