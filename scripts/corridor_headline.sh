#!/usr/bin/env bash
# The Corridor headline on held-out seeds (README, "What it reproduces"): the default on the full Corridor
# (python train_rl.py: PPO, Expire-Span, 3M steps), seeds 200-204, LANES at a time with one
# thread each (about 45 minutes a run alone on one core).
#   bash scripts/corridor_headline.sh [LANES] [RUNS]
#   python -m analysis.curves docs/results/learner/default/seed20? --markdown
# Runs go to RUNS (runs/corridor), each finished one's files to
# docs/results/learner/default/seedS (scripts/lanes.sh: the same command carries on).
set -euo pipefail
source "$(dirname "$0")/lanes.sh"

names=(seed200 seed201 seed202 seed203 seed204)
run_args() { echo "train_rl.py seed=${1#seed}"; }

run_lanes "${1:-1}" "${2:-runs/corridor}" docs/results/learner/default
