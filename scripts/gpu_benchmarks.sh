#!/usr/bin/env bash
# One device call's GPU checks and figures, most needed first, within BUDGET seconds (a call
# that outlasts its limit brings nothing back, so every step has its own limit and a step
# starts only with the time for it left). What is open (docs/performance.md, "On a GPU"): the
# PPO default's throughput at 4096 environments, the language model's step at every span
# (benchmarks/lm_gpu.py), what the compiled learner gains (compile_learner=default, then
# reduce-overhead: memories padded to few lengths, one compilation each, with the compiled
# acting step), the language model's step compiled (train_lm.py compile_step=default) for
# Expire-Span and Transformer-XL, then the full Corridor's candidate GPU settings on two more tuning seeds
# (scripts/gpu_corridor.sh) with what time is left. Each step appends to a file of OUT_DIR
# (at most 8 files come back from a call); log.txt says when each step started and how it
# ended.
#   bash scripts/gpu_benchmarks.sh OUT_DIR [BUDGET]
set -uo pipefail
out=$1 budget=${2:-500}
mkdir -p "$out"
deadline=$((SECONDS + budget))
export PYTHONUNBUFFERED=1

step() {  # LIMIT FILE COMMAND...: COMMAND's output appended to OUT_DIR/FILE, within LIMIT s
    local limit=$1 file=$2 left=$((deadline - SECONDS))
    shift 2
    if ((left < limit)); then
        echo "$(date +%T) skipped ($left s left, $limit needed): $*" >>"$out/log.txt"
        return
    fi
    echo "$(date +%T) start: $*" >>"$out/log.txt"
    timeout "$limit" "$@" >>"$out/$file" 2>&1
    local status=$?  # (before the date's command substitution sets $?)
    echo "$(date +%T) exit $status: $*" >>"$out/log.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    git log --oneline -1 2>/dev/null; } >"$out/device.txt" 2>&1
step 90 throughput.jsonl python benchmarks/throughput.py --settings gpu_ppo_4096
step 240 lm_gpu.jsonl python benchmarks/lm_gpu.py
for mode in default reduce-overhead; do
    step 180 profile.jsonl python benchmarks/update_profile.py --warmup 6 --updates 3 \
        device=cuda num_envs=1024 env.max_length=20 wandb.mode=disabled compile_acting=true \
        "compile_learner=$mode"
done
step 240 lm_gpu.jsonl python benchmarks/lm_gpu.py --kinds expire_span transformer_xl \
    --spans 1024 --compile default  # (L = 1024 only: each compilation may take a minute or more)
wall=$((deadline - SECONDS - 30))
if ((wall >= 120)); then
    step $((wall + 20)) log.txt bash scripts/gpu_corridor.sh /tmp/gpu_corridor "$wall" 1 2
    tar czf "$out/corridor.tgz" -C /tmp gpu_corridor
fi
