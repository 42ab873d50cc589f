#!/usr/bin/env bash
# Runs the main example three times with 2 processes: once straight through, once stopped by a checkpoint after
# STOP batches (mid-epoch, mid accumulation window), once resumed from that checkpoint. Passes when the resumed
# run ends with exactly the parameters of the straight run (same checksum) and the same accuracy line.
# Usage: check_resume.sh ACCEL_LAUNCH TRAIN DATA WORKDIR [STOP]
set -euo pipefail
launch=$1 train=$2 data=$3 work=$4 stop=${5:-101}
rm -rf "$work" && mkdir -p "$work"
run() { "$launch" --nproc-per-node 2 "$train" --data "$data" --epochs 4 "$@"; }
straight=$(run | tee "$work/straight.log" | grep -E "parameter checksum|held-out accuracy")
run --checkpoint-dir "$work/ckpt" --stop-after "$stop" > "$work/stopped.log"
grep -q "checkpoint saved" "$work/stopped.log"
resumed=$(run --checkpoint-dir "$work/ckpt" --resume | tee "$work/resumed.log" | grep -E "parameter checksum|held-out accuracy")
grep "resumed from" "$work/resumed.log"
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
