#!/usr/bin/env bash
# The Corridor headline (README, "What it reproduces"): the default on the full Corridor
# (python train_rl.py: PPO, Expire-Span, 3M steps) on seeds 300-309 and 310-319, which chose
# nothing (310-319 are fresh: the default was last changed after the previous defaults' runs on
# 300-309, docs/results/learner/held_penalty_default, let_go_default and following_default,
# were seen), and on
# 200-204, the seeds of the default's runs when the decisive-agent work began
# (docs/results/learner/pinned_default), for a before/after; LANES at a time with one thread
# each (about 25 minutes a run alone on one core).
#   bash scripts/corridor_headline.sh [LANES] [RUNS]
#   python -m analysis.curves docs/results/learner/default/seed3?? --acting --markdown
# Runs go to RUNS (runs/corridor), each finished one's files to
# docs/results/learner/default/seedS (scripts/lanes.sh: the same command carries on).
set -euo pipefail
source "$(dirname "$0")/lanes.sh"

names=(seed30{0..9} seed31{0..9} seed20{0..4})
run_args() { echo "train_rl.py seed=${1#seed}"; }

run_lanes "${1:-1}" "${2:-runs/corridor}" docs/results/learner/default
