#!/usr/bin/env bash
# A job that restarts itself: the main example under accel-launch --max-restarts 1, with a project folder (a
# checkpoint every 40 batches) and --resume-if-any, one of its 2 processes SIGKILLed 0.3-0.8 s into the training.
# Passes when the job ends with exit 0 after one restart, the first attempt started from the beginning, the second
# resumed from the project's latest checkpoint (or started again when none was complete yet), and the parameters and
# accuracy equal those of an uninterrupted run. Prints the times from the SIGKILL to the survivor's error, to the
# restart and to the restarted attempt's training (no bound: the machine may be busy; benchmarks/README.md).
# Usage: check_restart.sh ACCEL_LAUNCH TRAIN DATA WORKDIR
set -uo pipefail
launch=$1 train=$2 data=$3 work=$4
epochs=20
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAILED: $*"; exit 1; }
strip() { sed -E 's/; training took .*//'; }  # the accuracy line also carries the training time
now_us() { echo "${EPOCHREALTIME/./}"; }
stamp() { while IFS= read -r line; do echo "$(now_us) $line"; done; }  # each line with its arrival time (us)

timeout 300 "$launch" --nproc-per-node 2 "$train" --data "$data" --epochs $epochs > "$work/straight.log" 2>&1 ||
  { cat "$work/straight.log"; fail "the uninterrupted run failed"; }
straight=$(grep -E "parameter checksum|held-out accuracy" "$work/straight.log" | strip)

project="$work/project"
{ timeout 300 "$launch" --nproc-per-node 2 --max-restarts 1 "$train" --data "$data" --epochs $epochs \
    --project-dir "$project" --checkpoint-every 40 --resume-if-any 2>&1; echo "exit code $?"; } | stamp > "$work/job.log" &
job=$!
for _ in $(seq 1 1200); do grep -q "training on" "$work/job.log" && break; sleep 0.05; done
launcher=$(pgrep -f -- "^$launch --nproc-per-node 2 --max-restarts 1 $train .*--project-dir $project ")
[ -n "$launcher" ] || { wait $job; cat "$work/job.log"; fail "no launcher found"; }
sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.3 + (r % 51) / 100 }')"
mapfile -t workers < <(pgrep -P "$launcher")
[ ${#workers[@]} -eq 2 ] || { wait $job; cat "$work/job.log"; fail "expected 2 processes under the launcher, found ${#workers[@]}"; }
victim=${workers[$((RANDOM % 2))]}
killed=$(now_us)
kill -KILL "$victim"
wait $job
sed -E 's/^[0-9]+ //' "$work/job.log"

grep -q " exit code 0$" "$work/job.log" || fail "the restarted job did not end with exit code 0"
grep -q "accel-launch: restarting every process (restart 1 of --max-restarts 1; TORCHELASTIC_RESTART_COUNT=1)" "$work/job.log" ||
  fail "no restart (was the process killed after the training?)"
[ "$(grep -c "training on 2 process(es)" "$work/job.log")" -eq 2 ] || fail "expected two attempts that trained"
first=$(grep -m1 -E "\[0\] (no checkpoint under|resumed from)" "$work/job.log")
[[ "$first" == *"starting from the beginning"* ]] || fail "the first attempt did not start from the beginning: $first"
second=$(grep -E "\[0\] (no checkpoint under|resumed from)" "$work/job.log" | sed -n 2p)
echo "the restarted attempt: ${second#* }"
[ -n "$second" ] || fail "the restarted attempt said neither where it resumed nor that it started again"
restarted=$(sed -nE 's/^[0-9]+ \[0\] (parameter checksum|held-out accuracy)/\1/p' "$work/job.log" | strip)
echo "uninterrupted: $(echo "$straight" | sed -E 's/^\[0\] //' | tr '\n' ' ')"
echo "restarted:     $(echo "$restarted" | tr '\n' ' ')"
[ "$(echo "$straight" | sed -E 's/^\[0\] //')" == "$restarted" ] || fail "the restarted job differs from the uninterrupted one"

at() { awk -v k="$killed" -v p="$1" '$1 > k && index($0, p) { printf "%d", ($1 - k) / 1000; exit }' "$work/job.log"; }
echo "after the SIGKILL: survivor's error $(at "accel: rank") ms, restart $(at "restarting every process") ms, training again $(at "training on") ms"
echo "restart is bit-identical"
