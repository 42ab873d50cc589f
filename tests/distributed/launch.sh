#!/usr/bin/env bash
# accel-launch on several nodes and with restarts, with real training (accel_mp_tests elastic, tests/distributed/launch.cpp).
# Every "node" is a launcher on this machine talking over 127.0.0.1; every launcher runs under `timeout`.
#   launch.sh CASE ACCEL_LAUNCH ACCEL_MP_TESTS WORKDIR [PORT]
# CASE:
#   nodes          two launchers (--nnodes 2, one process each) train exactly as one launcher with two processes
#   propagate      rank 1 (node 1) is SIGKILLed: node 0's launcher stops its process within seconds and both launchers
#                  end with 137, the failing rank's code
#   restart        rank 1 is SIGKILLed mid-training under --max-restarts 1: the job ends with 0 and the parameters of
#                  an uninterrupted run (resumed from the latest checkpoint); prints the restart time
#   restart-nodes  the same on two nodes: both launchers restart their process together
#   exhausted      rank 1 dies in every generation under --max-restarts 1: one restart, then the job ends with 137
#   mismatch       nodes started with different --nproc-per-node: both launchers refuse, naming the difference
set -uo pipefail
case=$1 launch=$2 mp=$3 work=$4 port=${5:-0}
limit=60  # seconds for one launcher
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAILED: $*"; exit 1; }
now_ms() { date +%s%3N; }
checksum_of() { sed -nE 's/^\[0\] elastic: parameter checksum ([0-9a-f]+ after [0-9]+ batches)$/\1/p' "$1" | head -1; }

# The reference: one launcher, two processes, never interrupted.
reference() {
  timeout $limit "$launch" --nproc-per-node 2 "$mp" elastic "$work/ref_ckpt" > "$work/ref.log" 2>&1 || { cat "$work/ref.log"; fail "the reference run failed"; }
  ref=$(checksum_of "$work/ref.log")
  [ -n "$ref" ] || { cat "$work/ref.log"; fail "no checksum in the reference run"; }
  echo "uninterrupted, one node, 2 processes: checksum $ref"
}

# Two launchers (node ranks 0 and 1, one process each) in the background; waits for both. Sets rc0, rc1, end0 (ms).
two_nodes() {
  local common=(--nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port" --join-timeout 30)
  timeout $limit "$launch" "${common[@]}" --node-rank 0 "$@" > "$work/node0.log" 2>&1 &
  local p0=$!
  timeout $limit "$launch" "${common[@]}" --node-rank 1 "$@" > "$work/node1.log" 2>&1 &
  local p1=$!
  wait $p0; rc0=$?; end0=$(now_ms)
  wait $p1; rc1=$?
  echo "--- node 0"; cat "$work/node0.log"; echo "--- node 1"; cat "$work/node1.log"; echo "---"
  [ $rc0 -ne 124 ] && [ $rc1 -ne 124 ] || fail "a launcher hung (rc $rc0, $rc1)"
}

# ms from rank R's SIGKILL to the last rendezvous of generation 1 (the restarted processes all connected).
restart_time() {
  local killed back
  killed=$(cat "$@" | sed -nE 's/.*elastic: rank [0-9]+ kills itself at ([0-9]+) ms.*/\1/p' | head -1)
  back=$(cat "$@" | sed -nE 's/.*elastic: rank [0-9]+ generation 1 rendezvous at ([0-9]+) ms.*/\1/p' | sort -n | tail -1)
  [ -n "$killed" ] && [ -n "$back" ] || fail "no kill or no restarted rendezvous in the output"
  echo $((back - killed))
}

case $case in
  nodes)
    reference
    two_nodes "$mp" elastic "$work/ckpt"
    [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "the two-node job failed (rc $rc0, $rc1)"
    got=$(checksum_of "$work/node0.log")
    echo "two nodes, 1 process each: checksum $got"
    [ "$got" == "$ref" ] || fail "two nodes differ from one node with the same processes"
    echo "ok: two nodes train exactly as one node";;
  propagate)
    two_nodes --grace 0 "$mp" elastic "$work/ckpt" 3 4 1:5
    [ $rc0 -eq 137 ] && [ $rc1 -eq 137 ] || fail "expected both launchers to end with 137 (rank 1's SIGKILL), got $rc0 and $rc1"
    grep -q "accel-launch: node 1: rank 1 was killed by signal 9" "$work/node1.log" || fail "node 1 did not report its rank"
    # Node 0 names rank 1 whichever it hears first: node 1's report in the store (then it stops its process), or its
    # own rank 0 leaving the collective at once (the survivors' watch) while the report was already there.
    grep -qE "accel-launch: node 0: rank 1 on node 1 was killed by signal 9 \(Killed\)(; stopping the 1 process\(es\) of this node| \(and here rank 0 exited with code [0-9]+\))" \
      "$work/node0.log" || fail "node 0 did not name node 1's failure"
    killed=$(sed -nE 's/.*kills itself at ([0-9]+) ms.*/\1/p' "$work/node1.log")
    [ -n "$killed" ] || fail "no kill time"
    took=$((end0 - killed))
    echo "failure propagation: node 0's launcher ended ${took} ms after rank 1 (node 1) was killed"
    [ $took -lt 10000 ] || fail "node 0 took ${took} ms to stop (limit 10 s)"
    echo "ok: a failure on node 1 stops node 0 with the failing rank's code";;
  restart)
    reference
    timeout $limit "$launch" --nproc-per-node 2 --max-restarts 1 "$mp" elastic "$work/ckpt" 3 4 1:17 > "$work/job.log" 2>&1
    rc=$?
    cat "$work/job.log"
    [ $rc -eq 0 ] || fail "the restarted job ended with $rc"
    grep -q "accel-launch: restarting every process (restart 1 of --max-restarts 1; TORCHELASTIC_RESTART_COUNT=1)" "$work/job.log" ||
      fail "no restart reported"
    grep -q "elastic: generation 1, 2 processes, resumed after batch 16" "$work/job.log" || fail "not resumed from the checkpoint of batch 16"
    got=$(checksum_of "$work/job.log")
    echo "killed at batch 17, restarted, resumed: checksum $got"
    [ "$got" == "$ref" ] || fail "the restarted job differs from the uninterrupted one"
    echo "restart time: $(restart_time "$work/job.log") ms from the SIGKILL to the restarted processes' rendezvous"
    echo "ok: restarted after a SIGKILL, bit-identical to the uninterrupted run";;
  restart-nodes)
    reference
    two_nodes --max-restarts 1 "$mp" elastic "$work/ckpt" 3 4 1:17
    [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "the restarted two-node job failed (rc $rc0, $rc1)"
    for n in 0 1; do
      grep -q "accel-launch: node $n: restarting every process (restart 1 of --max-restarts 1" "$work/node$n.log" ||
        fail "node $n did not restart"
    done
    got=$(checksum_of "$work/node0.log")
    echo "two nodes, killed at batch 17 on node 1, restarted: checksum $got"
    [ "$got" == "$ref" ] || fail "the restarted two-node job differs from the uninterrupted one"
    echo "restart time: $(restart_time "$work/node0.log" "$work/node1.log") ms from the SIGKILL to the restarted processes' rendezvous"
    echo "ok: every node restarted its processes together";;
  exhausted)
    timeout $limit "$launch" --nproc-per-node 2 --max-restarts 1 "$mp" elastic "$work/ckpt" 3 4 1:17:99 > "$work/job.log" 2>&1
    rc=$?
    cat "$work/job.log"
    [ $rc -eq 137 ] || fail "expected 137 (the second SIGKILL), got $rc"
    [ "$(grep -c "kills itself" "$work/job.log")" -eq 2 ] || fail "expected exactly two attempts"
    grep -q "elastic: generation 1, 2 processes, resumed after batch 16" "$work/job.log" || fail "the restart did not resume"
    grep -q "accel-launch: no restart left (--max-restarts 1); ending with exit code 137" "$work/job.log" || fail "no final message"
    echo "ok: after the last restart, the next failure ends the job with its code";;
  mismatch)
    common=(--nnodes 2 --master-addr 127.0.0.1 --master-port "$port" --join-timeout 30)
    timeout $limit "$launch" "${common[@]}" --node-rank 0 --nproc-per-node 1 true > "$work/node0.log" 2>&1 &
    p0=$!
    timeout $limit "$launch" "${common[@]}" --node-rank 1 --nproc-per-node 2 true > "$work/node1.log" 2>&1
    rc1=$?
    wait $p0; rc0=$?
    cat "$work/node0.log" "$work/node1.log"
    [ $rc0 -eq 2 ] && [ $rc1 -eq 2 ] || fail "expected both launchers to refuse with 2, got $rc0 and $rc1"
    grep -q "accel-launch: node 0: node 1 was started with --nnodes 2 --nproc-per-node 2 --max-restarts 0, this node with --nnodes 2 --nproc-per-node 1 --max-restarts 0; start every node with the same" \
      "$work/node0.log" || fail "node 0 did not name the difference"
    echo "ok: nodes started differently are refused";;
  *) fail "unknown case $case";;
esac
