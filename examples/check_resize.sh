#!/usr/bin/env bash
# Runs the main example stopped by a checkpoint with 3 processes, resumed with 2 (README, "Resuming at another world
# size"): the resumed run says where it resumed and finishes. Then the same checkpoint with a 1,200-row copy of the
# data: refused, naming the dataset sizes.
# Usage: check_resize.sh ACCEL_LAUNCH TRAIN DATA WORKDIR [STOP]
set -uo pipefail
launch=$1 train=$2 data=$3 work=$4 stop=${5:-50}
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAILED: $*"; exit 1; }
run() { local n=$1 csv=$2; shift 2; timeout 240 "$launch" --nproc-per-node "$n" "$train" --data "$csv" --epochs 3 --project-dir "$work/project" "$@"; }
run 3 "$data" --stop-after "$stop" > "$work/stopped.log" 2>&1 || { cat "$work/stopped.log"; fail "the 3-process run"; }
grep -q "checkpoint saved" "$work/stopped.log" || fail "no checkpoint saved"
run 2 "$data" --resume > "$work/resumed.log" 2>&1 || { cat "$work/resumed.log"; fail "the 2-process resume"; }
cat "$work/resumed.log"
grep -qE "resumed from .*: epoch [0-9]+ at sample [0-9]+ of 1500, checkpoint of 3 processes, now 2" "$work/resumed.log" ||
  fail "the resumed run does not say where it resumed"
grep -q "held-out accuracy" "$work/resumed.log" || fail "the resumed run did not finish"
head -n 1200 "$data" > "$work/digits_1200.csv"
run 2 "$work/digits_1200.csv" --resume > "$work/other_data.log" 2>&1 && { cat "$work/other_data.log"; fail "a checkpoint of another dataset size was resumed"; }
cat "$work/other_data.log"
grep -q "loader 0 of .* was saved for a dataset of 1500 samples, this loader's has 903" "$work/other_data.log" ||
  fail "the error does not name the dataset sizes"
echo "resized resume ok"
