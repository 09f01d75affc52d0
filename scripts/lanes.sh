# Training runs shared out among LANES processes of one thread each; sourced by the scripts
# that queue them (tuning.sh, suite.sh, corridor_headline.sh), which set `names` (the runs, in
# order) and `run_args NAME` (its trainer and overrides, e.g. `train_rl.py seed=200`) and call
# `run_lanes LANES RUNS KEPT`.
# Every lane walks the same list: a run kept in KEPT/NAME (its config, metrics and evaluation,
# copied there when it finishes) is skipped, a run another lane holds is refused and passed,
# and a stopped run continues from its checkpoint (resume=auto), so the same command carries
# on a stopped queue. A script may also define `after_run RUN_DIR KEPT_DIR`, called once a
# run is kept (a probe of the trained model, say); should it fail, the lane's log says so and
# the run stays kept. RUNS/laneN.log holds each lane's output. With LANES_PRINT=1 the script
# prints each run's name and command instead, and runs nothing.

lane() {
    local number=$1 runs=$2 kept=$3 name
    for name in "${names[@]}"; do
        [ -f "$kept/$name/eval.json" ] && continue
        read -ra args <<<"$(run_args "$name")"
        if python "${args[@]}" torch_threads=1 wandb.mode=disabled resume=auto \
            "hydra.run.dir=$runs/$name" >>"$runs/lane$number.log" 2>&1 \
            && [ -f "$runs/$name/eval.json" ]; then
            mkdir -p "$kept/$name"
            cp "$runs/$name"/{config.yaml,metrics.jsonl,eval.json} "$kept/$name/"
            if declare -F after_run >/dev/null; then
                after_run "$runs/$name" "$kept/$name" >>"$runs/lane$number.log" 2>&1 \
                    || echo "after_run $name failed" >>"$runs/lane$number.log"
            fi
        fi
    done
}

probe_test_split() {  # PROBE RUN_DIR KEPT_DIR: `analysis.PROBE`'s JSON of the test split, kept
    local tmp="$3/.$1.tmp"
    if python -m "analysis.$1" "$2" --split test --threads 1 >"$tmp"; then
        mv "$tmp" "$3/$1_test.json"
    else
        rm -f "$tmp"
        return 1
    fi
}

run_lanes() {
    local lanes=$1 runs=$2 kept=$3 i name
    if [ -n "${LANES_PRINT:-}" ]; then
        for name in "${names[@]}"; do echo "$name: python $(run_args "$name")"; done
        return
    fi
    mkdir -p "$runs"
    for i in $(seq "$lanes"); do
        lane "$i" "$runs" "$kept" &
        # (so that two lanes do not claim the same first run at once; none after the last)
        if [ "$i" -lt "$lanes" ]; then sleep 5; fi
    done
    wait
}
