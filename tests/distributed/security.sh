#!/usr/bin/env bash
# The job's rendezvous store, attacked and inspected (accel/state/rendezvous/store.hpp). Every process runs under `timeout`.
#   security.sh CASE ACCEL_LAUNCH ACCEL_MP_TESTS WORKDIR PORT
# CASE:
#   surface-launch  accel-launch, 2 processes: every socket of the launcher and the ranks listens on loopback only
#   surface-rank0   2 processes started by hand (MASTER_ADDR=127.0.0.1): rank 0 hosts the store, on loopback only
#   foreign         a client outside the job overwrites every key it finds (arrival, heartbeat, Gloo addresses) and
#                   writes failures, from the rendezvous to the end of training: the job ends with every result right,
#                   and reports the foreign values
#   wrong-secret    2 processes with different ACCEL_JOB_SECRET: both are refused with an error naming the secret
#   two-jobs        two jobs (ids a and b) on one store: each all_reduce sums its own job's values only
set -uo pipefail
case=$1 launch=$2 mp=$3 work=$4 port=$5
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAILED: $*"; exit 1; }
show() { for f in "$@"; do echo "--- $f"; cat "$work/$f"; done; echo "---"; }
passed() { grep -qE "rank 0: [1-9][0-9]* passed, 0 failed" "$work/$1" && ! grep -qE "FAILED|[1-9][0-9]* failed" "$work/$1"; }
# Two processes started by hand: by_hand LOGPREFIX MODE ARGS... (env: EXTRA0, EXTRA1 hold each rank's extra variables)
by_hand() {
  local log=$1; shift
  local pids=()
  for r in 0 1; do
    local extra=EXTRA$r
    env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ${!extra:-} \
      timeout 60 "$mp" "$@" > "$work/$log$r.log" 2>&1 &
    pids+=($!)
  done
  rc=()
  for p in "${pids[@]}"; do wait "$p"; rc+=($?); done
}

case $case in
  surface-launch)
    timeout 60 "$launch" --nproc-per-node 2 --master-port "$port" "$mp" surface > "$work/job.log" 2>&1
    show job.log
    passed job.log || fail "the job's listening sockets"
    echo "ok: accel-launch and its processes listen on loopback only";;
  surface-rank0)
    by_hand rank surface
    show rank0.log rank1.log
    [ "${rc[0]}" -eq 0 ] && [ "${rc[1]}" -eq 0 ] && passed rank0.log || fail "the job's listening sockets (rc ${rc[*]})"
    echo "ok: rank 0's store and the ranks listen on loopback only";;
  foreign)
    timeout 60 "$mp" foreign-writer "$port" 8 > "$work/foreign.log" 2>&1 &
    writer=$!
    timeout 60 "$launch" --nproc-per-node 2 --master-port "$port" "$mp" attacked 4 > "$work/job.log" 2>&1
    rc=$?
    wait $writer
    show foreign.log job.log
    [ $rc -eq 0 ] && passed job.log || fail "the attacked job did not end right (rc $rc)"
    grep -qE "foreign client: wrote [1-9][0-9]* values" "$work/foreign.log" || fail "the foreign client wrote nothing"
    grep -qE "the rendezvous store's key 'accel/[0-9a-f]+/0/[a-z]+/[0-9]+' (was replaced by a value this process did not write|fails authentication)" \
      "$work/job.log" || fail "the job did not report the foreign values"
    echo "ok: a foreign writer neither stops nor redirects the job, and is reported";;
  wrong-secret)
    EXTRA0="ACCEL_JOB_SECRET=0123456789abcdef-first" EXTRA1="ACCEL_JOB_SECRET=0123456789abcdef-other" by_hand rank rendezvous 20000
    show rank0.log rank1.log
    for r in 0 1; do
      [ "${rc[$r]}" -ne 0 ] && [ "${rc[$r]}" -ne 124 ] || fail "rank $r was not refused (rc ${rc[$r]})"
      grep -q "fails authentication with this process's job secret" "$work/rank$r.log" || fail "rank $r's error does not name the secret"
    done
    echo "ok: processes with different secrets are refused, naming the secret";;
  two-jobs)
    timeout 60 "$mp" store-host "$port" 30 > "$work/store.log" 2>&1 &
    host=$!
    sleep 1
    pids=()
    for job in a b; do
      value=$([ $job == a ] && echo 1000 || echo 1)
      for r in 0 1; do
        env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
          TORCHELASTIC_USE_AGENT_STORE=True ACCEL_JOB_ID=$job timeout 60 "$mp" job-sum $value > "$work/$job$r.log" 2>&1 &
        pids+=($!)
      done
    done
    rcs=()
    for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
    kill $host 2>/dev/null
    show a0.log a1.log b0.log b1.log
    for i in 0 1 2 3; do [ "${rcs[$i]}" -eq 0 ] || fail "a process of the two jobs failed (rc ${rcs[*]})"; done
    passed a0.log && passed b0.log || fail "a job summed another job's values"
    echo "ok: two jobs on one store keep to their own keys";;
  *) fail "unknown case $case";;
esac
