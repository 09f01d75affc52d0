#!/usr/bin/env bash
# The GPU's figures in one call of a few minutes (docs/performance.md, "On a GPU"): the device,
# RL throughput on Corridor 3..20 at 1024 and 4096 environments (PPO default and the paper's
# A2C) beside the default's 32, and the enwik8-sized LM step of every memory kind, fp32 then
# bf16. Each benchmark prints JSON lines into OUT_DIR.
#   bash scripts/gpu_benchmarks.sh [OUT_DIR]
set -euo pipefail
out=${1:-runs/gpu-benchmarks}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/device.csv"
python benchmarks/throughput.py --settings gpu_ppo_1024 gpu_ppo_4096 gpu_a2c_1024 \
    gpu_a2c_4096 corridor_start >"$out/throughput.jsonl"
python benchmarks/lm_gpu.py >"$out/lm_gpu.jsonl"
python benchmarks/lm_gpu.py --precision bf16 --spans 16384 >"$out/lm_gpu_bf16.jsonl"
