#!/usr/bin/env bash
# Runs the main example three times with 2 processes: once straight through, once with a project folder (a
# checkpoint every 40 batches, the 2 latest kept) stopped by a checkpoint after STOP batches (mid-epoch, mid
# accumulation window), once resumed from the project's latest checkpoint. Passes when the resumed run ends with
# exactly the parameters of the straight run (same checksum) and the same accuracy line, the project keeps the 2
# latest checkpoints, and its metrics file holds one line per epoch over both runs.
# Usage: check_resume.sh ACCEL_LAUNCH TRAIN DATA WORKDIR [STOP]
set -euo pipefail
launch=$1 train=$2 data=$3 work=$4 stop=${5:-101}
rm -rf "$work" && mkdir -p "$work"
run() { "$launch" --nproc-per-node 2 "$train" --data "$data" --epochs 4 "$@"; }
straight=$(run | tee "$work/straight.log" | grep -E "parameter checksum|held-out accuracy")
project="$work/project"
run --project-dir "$project" --checkpoint-every 40 --stop-after "$stop" > "$work/stopped.log"
grep -q "checkpoint saved" "$work/stopped.log"
resumed=$(run --project-dir "$project" --checkpoint-every 40 --resume | tee "$work/resumed.log" | grep -E "parameter checksum|held-out accuracy")
grep "resumed from" "$work/resumed.log"
kept=$(ls "$project/checkpoints" | tr '\n' ' ')
echo "checkpoints kept: $kept"
[ "$(ls "$project/checkpoints" | wc -l)" -eq 2 ] || { echo "the project keeps $kept, not the 2 latest"; exit 1; }
steps=$(sed -nE 's/^\{"step":([0-9]+),.*/\1/p' "$project/digits/metrics.jsonl" | tr '\n' ' ')
[ "$steps" = "0 1 2 3 " ] || { echo "metrics.jsonl steps '$steps', not one per epoch over both runs"; exit 1; }
# The accuracy line also carries the training time, which differs; compare accuracy and checksum only.
strip() { sed -E 's/; training took .*//'; }
echo "straight: $(echo "$straight" | strip | tr '\n' ' ')"
echo "resumed:  $(echo "$resumed" | strip | tr '\n' ' ')"
if [[ "$(echo "$straight" | strip)" == "$(echo "$resumed" | strip)" ]]; then
  echo "resume is bit-identical"
else
  echo "resume DIFFERS from the uninterrupted run"
  exit 1
fi
