#!/usr/bin/env bash
# Portal at the paper's scale on one GPU, one device call at a time (issue: Portal at 1024
# environments): benchmarks/portal.py's AGENT (expire_span | transformer_xl_100) on SEED for
# STEPS steps (default 100M), for at most WALL seconds of this call. The run lives in
# runs/portal/AGENT/seedSEED and continues from its checkpoint where an earlier call left one
# (carry that directory). What comes back in OUT_DIR, at most 8 files of 16 MiB: run.tgz (the
# run's files but its checkpoint), checkpoint.pt cut into parts of 15 MiB, and log.txt. To
# carry the run to the next call, put it back together here first:
#   mkdir -p runs/portal/AGENT/seedSEED && tar xzf OUT_DIR/run.tgz -C runs/portal/AGENT/seedSEED
#   cat OUT_DIR/checkpoint.pt.part* > runs/portal/AGENT/seedSEED/checkpoint.pt
#
#   bash scripts/gpu_portal.sh OUT_DIR AGENT SEED WALL [STEPS]
set -uo pipefail
out=$1 agent=$2 seed=$3 wall=$4 steps=${5:-100000000}
run_dir=runs/portal/$agent/seed$seed
mkdir -p "$out"
export PYTHONUNBUFFERED=1

echo "$(date +%T) start: $agent seed $seed, $wall s, $steps steps" >>"$out/log.txt"
timeout "$wall" python benchmarks/portal.py --out runs/portal --agents "$agent" \
    --seeds "$seed" --steps "$steps" >>"$out/log.txt" 2>&1
status=$?  # (before the date's command substitution sets $?)
echo "$(date +%T) exit $status (124: stopped at $wall s; its last checkpoint stays)" >>"$out/log.txt"

tar czf "$out/run.tgz" -C "$run_dir" --exclude="checkpoint*.pt" --exclude=.run.lock .
checkpoint=$run_dir/checkpoint.pt
if [ -f "$checkpoint" ] && (($(stat -c %s "$checkpoint") > 6 * 15 * 2 ** 20)); then
    echo "checkpoint.pt is over 6 parts of 15 MiB: not brought back" >>"$out/log.txt"
elif [ -f "$checkpoint" ]; then
    split -b 15M -d "$checkpoint" "$out/checkpoint.pt.part"
fi
ls -l "$out" >>"$out/log.txt"
