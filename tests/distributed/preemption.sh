#!/usr/bin/env bash
# Preemption (Options::preemption, accel/state/preemption.hpp): a 2-process job asked to stop by a signal saves a
# checkpoint at the next step boundary on every rank and exits; restarted, it resumes from the project's latest
# checkpoint (load_state()) and ends with the parameter checksum of a run that was never stopped
# (accel_mp_tests preemptible, tests/distributed/launch.cpp). Every launcher runs under `timeout`.
#   preemption.sh CASE ACCEL_LAUNCH ACCEL_MP_TESTS WORKDIR PORT
# CASE:
#   rank-term      rank 1 alone receives SIGTERM inside an accumulation window: both ranks save after the next
#                  optimizer step and exit 0
#   launcher-usr1  SIGUSR1 (SLURM's --signal=USR1@T) to accel-launch at a random moment, twice: it forwards it, the job
#                  saves and exits 0 each time (checkpoint_0, then checkpoint_1), the third run ends the training
#   launcher-term  SIGTERM to accel-launch at a random moment: forwarded, the job saves and stops, the launcher ends
#                  with 143 (interrupted), and the restarted job ends the training
set -uo pipefail
case=$1 launch=$2 mp=$3 work=$4
limit=90     # seconds for one launcher
epochs=40    # 12 batches an epoch per rank: 480 batches
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAILED: $*"; exit 1; }
show() { echo "--- $1"; cat "$work/$1"; echo "---"; }
checksum_of() { sed -nE 's/^\[0\] preemptible: parameter checksum ([0-9a-f]+ after [0-9]+ batches)$/\1/p' "$1" | head -1; }

timeout $limit "$launch" --nproc-per-node 2 "$mp" preemptible "$work/reference" $epochs > "$work/ref.log" 2>&1 || { show ref.log; fail "the reference run failed"; }
ref=$(checksum_of "$work/ref.log")
[ -n "$ref" ] || { show ref.log; fail "no checksum in the reference run"; }
echo "never stopped: checksum $ref"
project="$work/project"

# Runs the job in the background with PACE_MS per batch, waits until it trains, waits a random 0.1-0.8 s, sends
# SIGNAL to the launcher; waits for it. Sets rc. stopped LOG SIGNAL
stopped() {
  local log=$1 sig=$2
  timeout $limit "$launch" --nproc-per-node 2 "$mp" preemptible "$project" $epochs 5 > "$work/$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do grep -q "preemptible: training" "$work/$log" && break; sleep 0.05; done
  sleep "0.$((RANDOM % 8 + 1))"
  pkill -"$sig" -P $pid  # the launcher (the child of `timeout`)
  wait $pid; rc=$?
  show "$log"
}
# The checkpoint LOG's job saved: "checkpoint_<n>" from its message, which must name every rank's save.
saved_by() {
  grep -qE "^\[0\] accel: signal [0-9]+ received; saving a checkpoint at this step boundary" "$work/$1" || fail "$1: no save at a step boundary"
  sed -nE 's/^\[0\] accel: checkpoint saved to .*\/(checkpoint_[0-9]+); resume with load_state\(\)$/\1/p' "$work/$1" | head -1
}
# Restarts the job to the end: it must resume from checkpoint EXPECTED and end with the reference checksum.
finish() {
  local expected=$1
  timeout $limit "$launch" --nproc-per-node 2 "$mp" preemptible "$project" $epochs > "$work/resumed.log" 2>&1 || { show resumed.log; fail "the resumed run failed"; }
  show resumed.log
  grep -qE "^\[0\] preemptible: resumed from $expected after batch [1-9][0-9]*$" "$work/resumed.log" || fail "did not resume from $expected"
  got=$(checksum_of "$work/resumed.log")
  [ "$got" = "$ref" ] || fail "resumed checksum '$got', never stopped '$ref'"
}

case $case in
  rank-term)
    timeout $limit "$launch" --nproc-per-node 2 "$mp" preemptible "$project" $epochs 0 1:9:15 > "$work/stopped.log" 2>&1
    rc=$?
    show stopped.log
    [ $rc -eq 0 ] || fail "the preempted job ended with $rc, not 0"
    [ "$(saved_by stopped.log)" = checkpoint_0 ] || fail "no checkpoint_0"
    ! grep -q "preemptible: parameter checksum" "$work/stopped.log" || fail "the preempted job went on training"
    # Saved after the optimizer step of batch 10, not inside the accumulation window of batch 9.
    timeout $limit "$launch" --nproc-per-node 2 "$mp" preemptible "$project" $epochs > "$work/resumed.log" 2>&1 || { show resumed.log; fail "the resumed run failed"; }
    show resumed.log
    grep -qE "^\[0\] preemptible: resumed from checkpoint_0 after batch 10$" "$work/resumed.log" || fail "not resumed after batch 10"
    [ "$(checksum_of "$work/resumed.log")" = "$ref" ] || fail "resumed checksum differs from $ref"
    echo "ok: one rank's SIGTERM stops every rank at the next step boundary; the restarted job ends as if never stopped";;
  launcher-usr1)
    stopped first.log USR1
    [ $rc -eq 0 ] || fail "the job stopped by SIGUSR1 ended with $rc, not 0"
    grep -q "received signal 10 (User defined signal 1); forwarding it to every process" "$work/first.log" || fail "the launcher did not forward SIGUSR1"
    [ "$(saved_by first.log)" = checkpoint_0 ] || fail "no checkpoint_0"
    stopped second.log USR1
    [ $rc -eq 0 ] || fail "the resumed job stopped by SIGUSR1 ended with $rc, not 0"
    grep -qE "^\[0\] preemptible: resumed from checkpoint_0 after batch" "$work/second.log" || fail "the second run did not resume"
    [ "$(saved_by second.log)" = checkpoint_1 ] || fail "the second stop did not save checkpoint_1"
    finish checkpoint_1
    echo "ok: SIGUSR1 to accel-launch, twice: each time every rank saved and exited 0; the third run ends as if never stopped";;
  launcher-term)
    stopped first.log TERM
    [ $rc -eq 143 ] || fail "the launcher interrupted by SIGTERM ended with $rc, not 143"
    [ "$(saved_by first.log)" = checkpoint_0 ] || fail "no checkpoint_0"
    finish checkpoint_0
    echo "ok: SIGTERM to accel-launch: every rank saved and stopped; the restarted job ends as if never stopped";;
  *) fail "unknown case $case";;
esac
