#!/usr/bin/env python3
"""The launcher's own store traffic at N nodes, simulated on one machine: N accel-launch processes (one per "node",
all on loopback, node 0 hosting the store) each start one process that sleeps, and print their store requests at
their end (ACCEL_STORE_TRAFFIC=1). Three runs separate the costs:
  short      the processes sleep S seconds: the generation's end, the launchers leaving (the node meeting, which
             lasts as long as the launchers take to start, is counted apart: each prints its traffic after it)
  long       the same with S + 10 seconds: the 10 more seconds are the launchers' polling alone
  restart    as short, but one process exits 1 after S seconds and --max-restarts 1 restarts every node's process
             into generation 1: a failure and a restart generation

  launcher_scale.py ACCEL_LAUNCH [--nodes 128] [--sleep 3] [--json out.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

TRAFFIC = re.compile(r"store traffic at the end: (\d+) requests, (\d+) keys in ([0-9.]+) s")
MEETING = re.compile(r"store traffic after the meeting: (\d+) requests, (\d+) keys in ([0-9.]+) s")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(launch, nodes, sleep, fail_rank=None):
    port = free_port()
    env = dict(os.environ, ACCEL_STORE_TRAFFIC="1", ACCEL_JOB_SECRET="launcher-scale-secret", ACCEL_JOB_ID="scale")
    script = f"sleep {sleep}; "
    if fail_rank is not None:
        script += f'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = {fail_rank} ]; then exit 1; fi; '
    script += "exit 0"
    procs = []
    t0 = time.monotonic()
    for n in range(nodes):
        cmd = [launch, "--nnodes", str(nodes), "--node-rank", str(n), "--nproc-per-node", "1", "--master-addr",
               "127.0.0.1", "--master-port", str(port), "--max-restarts", "1", "--grace", "1", "--", "sh", "-c", script]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    requests = keys = meet_requests = meet_keys = 0
    meet_s = 0.0
    codes = []
    for p in procs:
        _, err = p.communicate(timeout=600)
        codes.append(p.returncode)
        m = TRAFFIC.search(err)
        if not m:
            sys.exit(f"launcher_scale: a launcher printed no traffic (exit {p.returncode}):\n{err[-2000:]}")
        requests += int(m.group(1))
        keys += int(m.group(2))
        m = MEETING.search(err)
        meet_requests += int(m.group(1))
        meet_keys += int(m.group(2))
        meet_s = max(meet_s, float(m.group(3)))
    wall = time.monotonic() - t0
    if any(codes):
        sys.exit(f"launcher_scale: launchers failed: {sorted(set(codes))}")
    # after the meeting: the generations, the polling, the end
    return {"requests": requests - meet_requests, "keys": keys - meet_keys, "wall_s": wall,
            "meeting": {"requests": meet_requests, "keys": meet_keys, "last_launcher_s": meet_s}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("launch")
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--sleep", type=float, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    short = run(a.launch, a.nodes, a.sleep)
    long_ = run(a.launch, a.nodes, a.sleep + 10)
    restart = run(a.launch, a.nodes, a.sleep, fail_rank=a.nodes // 2)
    poll = {k: (long_[k] - short[k]) / 10 for k in ("requests", "keys")}  # per second, the whole job
    once = {k: short[k] - poll[k] * a.sleep for k in ("requests", "keys")}  # a generation's end, leaving
    meet = short["meeting"]
    # the restart run polls for about two generations of `sleep`
    restart_cost = {k: restart[k] - short[k] - poll[k] * a.sleep for k in ("requests", "keys")}
    out = {"nodes": a.nodes, "sleep_s": a.sleep, "short": short, "long": long_, "restart": restart,
           "polling_per_s": poll, "meeting": meet, "end": once, "failure_and_restart": restart_cost}
    print(f"launchers at {a.nodes} nodes (one process each, on loopback):")
    print(f"  polling:            {poll['requests']:8.0f} requests/s {poll['keys']:8.0f} keys/s for the job "
          f"({poll['requests'] / a.nodes:.1f} requests/s per node)")
    print(f"  meeting:            {meet['requests']:8.0f} requests   {meet['keys']:8.0f} keys "
          f"({meet['requests'] / a.nodes:.1f} per node); the last launcher met after {meet['last_launcher_s']:.1f} s")
    print(f"  end of a job:       {once['requests']:8.0f} requests   {once['keys']:8.0f} keys "
          f"({once['requests'] / a.nodes:.1f} per node); wall {short['wall_s']:.1f} s for a {a.sleep:g} s job")
    print(f"  failure + restart:  {restart_cost['requests']:8.0f} requests   {restart_cost['keys']:8.0f} keys "
          f"({restart_cost['requests'] / a.nodes:.1f} per node); wall {restart['wall_s']:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
