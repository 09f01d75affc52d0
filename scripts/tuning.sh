#!/usr/bin/env bash
# Every memory of the suite tuned alike, on tuning seeds only (docs/results.md, "Tuning the
# suite's memories"): PPO epochs 4 or 8 x a constant or annealed rate, for Expire-Span,
# Transformer-XL, the GRU and the LSTM, on POPGym's RepeatPreviousEasy and MiniGrid's
# MemoryS13Random, seeds 0-2, at the suite's budget (configs/sweep/suite.yaml: 1M steps):
# 96 runs, LANES at a time with one thread each (about 11 hours of one core).
#   bash scripts/tuning.sh [LANES] [RUNS]
#   python -m analysis.tuning docs/results/tuning [--write configs/tuned]
# Runs go to RUNS (runs/rl-sweeps/tuning); a finished run's config, metrics and evaluation are
# copied to docs/results/tuning/NAME. A run kept there is skipped and a stopped one continues
# from its checkpoint, so the same command carries on a stopped job.
set -euo pipefail
lanes=${1:-2}
runs=${2:-runs/rl-sweeps/tuning}
kept=docs/results/tuning

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

lane() {  # every lane walks the same list; a run another lane holds is refused and passed
    for name in "${names[@]}"; do
        [ -f "$kept/$name/eval.json" ] && continue
        IFS=- read -r task memory epochs schedule seed <<<"$name"
        if python train_rl.py +sweep=suite "+benchmark=$task" "memory=$memory" \
            "agent.epochs=${epochs#e}" "agent.lr_schedule=$schedule" "seed=$seed" \
            torch_threads=1 wandb.mode=disabled "hydra.run.dir=$runs/$name" \
            >>"$runs/lane$1.log" 2>&1 && [ -f "$runs/$name/eval.json" ]; then
            mkdir -p "$kept/$name"
            cp "$runs/$name"/{config.yaml,metrics.jsonl,eval.json} "$kept/$name/"
        fi
    done
}

mkdir -p "$runs"
for i in $(seq "$lanes"); do
    lane "$i" &
    sleep 5  # (so that two lanes do not claim the same first run at once)
done
wait
