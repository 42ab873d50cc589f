#!/usr/bin/env bash
# Runs the main example with 2 processes: once straight through, once with a project folder (a checkpoint every
# 40 batches, the 2 latest kept) stopped by a checkpoint after STOP batches (mid-epoch, mid accumulation window),
# once resumed from the project's latest checkpoint. Passes when the resumed run ends with exactly the parameters
# of the straight run (same checksum) and the same accuracy line, the project keeps the 2 latest checkpoints, and
# its metrics file holds one line per epoch over both runs. The metrics must also be an uninterrupted run's (the
# same project settings, never stopped): the same metrics.jsonl and the same per-epoch loss lines, the interrupted
# epoch's loss included. And after a crash: a copy of the stopped project without its latest checkpoint (as if
# the job had died after STOP batches, its last checkpoint an earlier one, an epoch logged since) resumes to the
# same parameters and the same metrics.jsonl, the epoch logged after that checkpoint not twice.
# Usage: check_resume.sh ACCEL_LAUNCH TRAIN DATA WORKDIR [STOP]
set -euo pipefail
launch=$1 train=$2 data=$3 work=$4 stop=${5:-101}
rm -rf "$work" && mkdir -p "$work"
run() { "$launch" --nproc-per-node 2 "$train" --data "$data" --epochs 4 "$@"; }
straight=$(run | tee "$work/straight.log" | grep -E "parameter checksum|held-out accuracy")
project="$work/project"
run --project-dir "$project" --checkpoint-every 40 --stop-after "$stop" > "$work/stopped.log"
grep -q "checkpoint saved" "$work/stopped.log"
cp -r "$project" "$work/stopped_project"  # for the crash below
resumed=$(run --project-dir "$project" --checkpoint-every 40 --resume | tee "$work/resumed.log" | grep -E "parameter checksum|held-out accuracy")
grep "resumed from" "$work/resumed.log"
kept=$(ls "$project/checkpoints" | tr '\n' ' ')
echo "checkpoints kept: $kept"
[ "$(ls "$project/checkpoints" | wc -l)" -eq 2 ] || { echo "the project keeps $kept, not the 2 latest"; exit 1; }
steps=$(sed -nE 's/^\{"step":([0-9]+),.*/\1/p' "$project/digits/metrics.jsonl" | tr '\n' ' ')
[ "$steps" = "0 1 2 3 " ] || { echo "metrics.jsonl steps '$steps', not one per epoch over both runs"; exit 1; }
# The metrics of an uninterrupted run of the same project settings, and of a run resumed after a crash.
whole="$work/whole"
run --project-dir "$whole" --checkpoint-every 40 > "$work/whole.log"
epochs() { sed -nE 's/^\[0\] (epoch [0-9]+ .*)/\1/p' "$@"; }
[ "$(epochs "$work/stopped.log" "$work/resumed.log")" = "$(epochs "$work/whole.log")" ] ||
  { echo "epoch lines of the stopped and resumed runs:"; epochs "$work/stopped.log" "$work/resumed.log";
    echo "of the uninterrupted run:"; epochs "$work/whole.log"; exit 1; }
cmp "$project/digits/metrics.jsonl" "$whole/digits/metrics.jsonl" ||
  { echo "metrics.jsonl differs from the uninterrupted run's"; diff "$project/digits/metrics.jsonl" "$whole/digits/metrics.jsonl"; exit 1; }
echo "metrics equal the uninterrupted run's: $(epochs "$work/resumed.log" | tr '\n' ' ')"
crashed="$work/crashed"
rm -rf "$crashed" && cp -r "$work/stopped_project" "$crashed"
rm -rf "$crashed/checkpoints/$(ls "$crashed/checkpoints" | sort -t_ -k2 -n | tail -1)"
after_crash=$(run --project-dir "$crashed" --checkpoint-every 40 --resume | tee "$work/after_crash.log" | grep -E "parameter checksum|held-out accuracy")
grep "resumed from" "$work/after_crash.log"
cmp "$crashed/digits/metrics.jsonl" "$whole/digits/metrics.jsonl" ||
  { echo "after a crash, metrics.jsonl differs from the uninterrupted run's"; diff "$crashed/digits/metrics.jsonl" "$whole/digits/metrics.jsonl"; exit 1; }
# The accuracy line also carries the training time, which differs; compare accuracy and checksum only.
strip() { sed -E 's/; training took .*//'; }
[[ "$(echo "$after_crash" | strip)" == "$(echo "$straight" | strip)" ]] ||
  { echo "after a crash, the resumed run ends with other parameters: $(echo "$after_crash" | strip | tr '\n' ' ')"; exit 1; }
echo "resumed after a crash: the same metrics and parameters"
echo "straight: $(echo "$straight" | strip | tr '\n' ' ')"
echo "resumed:  $(echo "$resumed" | strip | tr '\n' ' ')"
if [[ "$(echo "$straight" | strip)" == "$(echo "$resumed" | strip)" ]]; then
  echo "resume is bit-identical"
else
  echo "resume DIFFERS from the uninterrupted run"
  exit 1
fi
