#!/usr/bin/env bash
# The trained agents a newcomer can evaluate and watch without training one (docs/usage.md,
# "A trained agent to try"), each on SEED (300):
# - the default Corridor agent (python train_rl.py env=corridor: PPO, Expire-Span, 3M steps,
#   about 25 minutes on one core), exported to trained/corridor.pt, one greedy episode of it
#   recorded, with what its memory keeps, to docs/results/corridor_episode.gif (on a corridor
#   of 3..60 cells, within the 3..200 it was trained on, so that the picture fits a page);
# - the Portal agent (python train_rl.py env=portal: the paper's settings, 20M steps as
#   benchmarks/portal.py trains it, about 2.5 hours on one core), exported to
#   trained/portal.pt, one greedy episode recorded to docs/results/portal_episode.gif.
# RECORD_SEED picks the recorded episode (another seed, another corridor or maze).
#   bash scripts/trained_agents.sh [SEED] [RECORD_SEED] [ENV...]
# The run's config, metrics and evaluation are kept in docs/results/trained/ENV.
# A stopped run continues from its checkpoint (resume=auto) and a finished one is not run
# again (a seed-300 run of the same command elsewhere can be linked to runs/trained/ENV-seed300);
# each step prints its command before it runs.
set -euo pipefail
seed=${1:-300}
record_seed=${2:-$seed}
envs=("${@:3}")
[ ${#envs[@]} -gt 0 ] || envs=(corridor portal)

step() {
    echo "+ $*"
    "$@"
}

declare -A settings=(
    [corridor]="env=corridor"
    [portal]="env=portal total_steps=20000000 checkpoint_interval=10"
)
declare -A recorded=([corridor]="env.max_length=60" [portal]="")
for env in "${envs[@]}"; do
    [ -n "${settings[$env]:-}" ] || { echo "no trained agent for env $env (corridor, portal)" >&2; exit 2; }
done
mkdir -p trained docs/results
for env in "${envs[@]}"; do
    run_dir=runs/trained/$env-seed$seed
    if [ ! -f "$run_dir/eval.json" ]; then
        # shellcheck disable=SC2086  # (the settings are separate overrides)
        step python train_rl.py ${settings[$env]} seed="$seed" "hydra.run.dir=$run_dir" \
            torch_threads=1 wandb.mode=disabled resume=auto
    fi
    step python -m training.export "$run_dir" "trained/$env.pt"
    mkdir -p "docs/results/trained/$env"  # (what the agent's figures come from)
    cp "$run_dir"/{config.yaml,metrics.jsonl,eval.json} "docs/results/trained/$env/"
    # shellcheck disable=SC2086  # (none or one override)
    step python train_rl.py mode=eval checkpoint="trained/$env.pt" eval.policy=greedy \
        eval.episodes=1 eval.num_envs=1 seed="$record_seed" ${recorded[$env]} \
        "eval.record=docs/results/${env}_episode.gif" torch_threads=1
done
