#!/usr/bin/env bash
# The exit soak (Note [Exit] in include/accel/state/rendezvous/rendezvous.hpp): RUNS times in a row, the main example with a
# project folder (checkpoints, trackers, preemption armed) is stopped by a checkpoint after 49 batches on 2 processes
# and resumed to the end of epoch 2 on NPROC processes, each launch bounded, with a CPU hog beside it to shift the
# timing of every exit; counts the abnormal exits (a non-zero status, or a rank killed by a signal, which the
# launcher reports). A finished job must always exit 0: a crash during exit-time destruction shows here as "killed by
# signal 11" (before the fix, 4 of 8 such resumed 3-process jobs did). Passes with "soak ok: RUNS runs, 0 abnormal
# exits"; stops early, without failing, when BUDGET seconds are spent (it says how many runs it made).
# Usage: soak.sh ACCEL_LAUNCH TRAIN DATA WORKDIR NPROC RUNS [BUDGET]
set -uo pipefail
launch=$1 train=$2 data=$3 work=$4 nproc=$5 runs=$6 budget=${7:-600}
rm -rf "$work" && mkdir -p "$work"
# The hog: one busy process per core, for as long as the soak runs.
hogs=()
for _ in $(seq "$(nproc)"); do (while :; do :; done) & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
start=$SECONDS made=0 abnormal=0
for i in $(seq "$runs"); do
  if (( SECONDS - start > budget )); then echo "budget of ${budget} s spent after $made runs"; break; fi
  log="$work/run_$i.log" project="$work/project"
  rm -rf "$project"
  timeout -k 5 120 "$launch" --nproc-per-node 2 "$train" --data "$data" --project-dir "$project" --stop-after 49 > "$log" 2>&1
  status=$?
  if (( status == 0 )); then
    timeout -k 5 120 "$launch" --nproc-per-node "$nproc" "$train" --data "$data" --project-dir "$project" --resume --epochs 2 >> "$log" 2>&1
    status=$?
  fi
  made=$((made + 1))
  if (( status != 0 )) || grep -q "killed by signal\|terminate called\|Segmentation\|Aborted" "$log"; then
    abnormal=$((abnormal + 1))
    echo "run $i: exit status $status"
    grep -E "accel-launch|signal|terminate|error" "$log" | head -n 5
  else
    rm -f "$log"
  fi
done
echo "$made runs of $nproc processes in $((SECONDS - start)) s, $abnormal abnormal exit(s)"
if (( abnormal == 0 && made > 0 )); then echo "soak ok: $made runs, 0 abnormal exits"; else echo "soak FAILED"; exit 1; fi
