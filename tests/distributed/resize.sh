#!/usr/bin/env bash
# Resuming at another number of processes (README, "Resuming at another world size"): a job saves a checkpoint
# mid-epoch with N processes, another resumes it with M (tests/distributed/data/resize.cpp). Every launch runs under
# `timeout`.
#   resize.sh CASE ACCEL_LAUNCH ACCEL_MP_TESTS WORKDIR PORT
# CASE:
#   loaders   sharded, split, dispatched, batch-sampler and stream loaders, N -> M for 2 -> 3, 3 -> 2, 2 -> 1, 1 -> 2:
#             the interrupted epoch's samples over both runs each once, the next epoch a fresh M-process job's
#   training  a model checkpointed with 3 processes, resumed with 2: the parameters of one process trained on the
#             same global batches
#   refused   a checkpoint saved inside a gradient-accumulation window, resumed at another size: a clear error
#   zero      the training case under ZeRO stage 2 (sharded momentum and gradients), 3 -> 2 and 2 -> 3 processes
#   fsdp      the training case under full sharding (sharded parameters, momentum and gradients), 3 -> 2 and 2 -> 3
set -uo pipefail
case=$1 launch=$2 mp=$3 work=$4 port=${5:-0}
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAILED: $*"; exit 1; }
show() { for f in "$@"; do echo "--- $f"; cat "$work/$f"; done; echo "---"; }
passed() { grep -qE "rank 0: [1-9][0-9]* passed, 0 failed" "$work/$1" && ! grep -qE "FAILED|[1-9][0-9]* failed" "$work/$1"; }
ports=(); [ "$port" != 0 ] && ports=(--master-port "$port")
# job LOG NPROC MODE ARGS...: one launch, bounded
job() {
  local log=$1 n=$2; shift 2
  timeout 120 "$launch" --nproc-per-node "$n" "${ports[@]}" "$mp" "$@" > "$work/$log" 2>&1
}

case $case in
  loaders)
    for resize in "2 3 2" "3 2 2" "2 1 3" "1 2 5"; do
      read -r n m stop <<< "$resize"
      rm -rf "$work/ckpt" "$work"/*.consumed
      job "save_${n}_${m}.log" "$n" resize-loaders save "$work" "$stop" || { show "save_${n}_${m}.log"; fail "saving with $n"; }
      job "resume_${n}_${m}.log" "$m" resize-loaders resume "$work"
      rc=$?
      show "resume_${n}_${m}.log"
      [ $rc -eq 0 ] && passed "resume_${n}_${m}.log" || fail "$n -> $m processes (rc $rc)"
    done
    echo "ok: six loaders resumed 2 -> 3, 3 -> 2, 2 -> 1 and 1 -> 2 processes, every sample once";;
  training)
    job save.log 3 resize-training save "$work" 3 || { show save.log; fail "saving with 3"; }
    job resume.log 2 resize-training resume "$work" 3
    rc=$?
    show save.log resume.log
    [ $rc -eq 0 ] && passed resume.log || fail "training resumed 3 -> 2 (rc $rc)"
    echo "ok: training checkpointed with 3 processes and resumed with 2 equals one process on the same global batches";;
  zero | fsdp)
    for resize in "3 2" "2 3"; do
      read -r n m <<< "$resize"
      rm -rf "$work/train_ckpt"
      job "save_${n}.log" "$n" resize-training save "$work" 3 "$case" || { show "save_${n}.log"; fail "saving with $n"; }
      job "resume_${n}_${m}.log" "$m" resize-training resume "$work" 3 "$case"
      rc=$?
      show "save_${n}.log" "resume_${n}_${m}.log"
      [ $rc -eq 0 ] && passed "resume_${n}_${m}.log" || fail "$case training resumed $n -> $m (rc $rc)"
    done
    echo "ok: $case training resumed 3 -> 2 and 2 -> 3 processes equals one process on the same global batches";;
  refused)
    job save.log 2 resize-training save "$work" 1 window || { show save.log; fail "saving with 2"; }
    grep -q "inside an accumulation window" "$work/save.log" || { show save.log; fail "the checkpoint was not saved inside a window"; }
    job resume.log 3 resize-training resume "$work" 1 window
    rc=$?
    show resume.log
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "a checkpoint saved inside an accumulation window was resumed with 3 processes (rc $rc)"
    grep -q "was saved inside a gradient-accumulation window by 2 process(es).*save at a step boundary" "$work/resume.log" ||
      fail "the error does not say to save at a step boundary"
    job same.log 2 resize-training resume "$work" 1 window
    rc=$?
    [ $rc -eq 0 ] || { show same.log; fail "the same checkpoint with 2 processes (rc $rc)"; }
    echo "ok: a checkpoint inside an accumulation window resumes with its own number of processes only, and says why";;
  *) fail "unknown case $case";;
esac
