#!/usr/bin/env python3
"""How fast a job restarts after a SIGKILL: the main example (examples/train.cpp) under
`accel-launch --nproc-per-node 2 --max-restarts 1`, with a project folder, a checkpoint every 50 batches and
--resume-if-any; one of its two processes is SIGKILLed at a random moment of the training (0.3-2.5 s in).

Every output line is timestamped as it arrives (through the launcher's pipes); from the SIGKILL it reports when
the survivor's error appeared (it left its collective), when the launcher restarted the processes (the survivor
had ended), and when the restarted attempt printed "training on" (load_state done, its first step next). Each run
must end with exit 0 and the checksum of an uninterrupted run.

    python3 benchmarks/restart.py [--build build] [--runs 10] [--epochs 60]
"""
import argparse
import os
import random
import re
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def one_run(launch, cmd, after):
    """Starts the job, SIGKILLs one of its processes `after` seconds into its training; returns the timed lines."""
    p = subprocess.Popen([launch, "--nproc-per-node", "2", "--max-restarts", "1"] + cmd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, bufsize=1)
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    lines, killed, training = [], None, None
    while True:
        timeout = None if training is None or killed is not None else max(0.0, training + after - time.time())
        if not sel.select(timeout):
            workers = children(p.pid)
            if len(workers) == 2:
                os.kill(random.choice(workers), 9)
                killed = time.time()
            else:  # the training ended first: nothing to kill
                killed = float("nan")
            continue
        line = p.stdout.readline()
        if not line:
            break
        now = time.time()
        lines.append((now, line.rstrip("\n")))
        if training is None and "training on" in line:
            training = now
    p.wait()
    return p.returncode, killed, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--build", default=os.path.join(root, "build"))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=60)
    args = ap.parse_args()
    launch = os.path.join(args.build, "tools", "accel-launch")
    train = os.path.join(args.build, "examples", "train")
    data = os.path.join(root, "examples", "data", "digits.csv")
    work = tempfile.mkdtemp(prefix="accel-restart-")
    load = os.getloadavg()
    try:
        ref = subprocess.run([launch, "--nproc-per-node", "2", train, "--data", data, "--epochs", str(args.epochs)],
                             capture_output=True, text=True, check=True).stdout
        reference = re.findall(r"parameter checksum (\w+)", ref)[-1]
        marks = {"survivor's error": r"\] accel: rank \d+: ", "restart": r"restarting every process",
                 "training again": r"training on"}
        got = {k: [] for k in marks}
        for i in range(args.runs):
            project = os.path.join(work, f"run{i}")
            rc, killed, lines = one_run(launch, [train, "--data", data, "--epochs", str(args.epochs), "--project-dir",
                                                 project, "--checkpoint-every", "50", "--resume-if-any"],
                                        random.uniform(0.3, 2.5))
            after = {k: next(((t - killed) * 1000 for t, l in lines if t >= killed and re.search(m, l)), None)
                     for k, m in marks.items()}
            checksum = (re.findall(r"parameter checksum (\w+)", "\n".join(l for _, l in lines)) or ["none"])[-1]
            same = checksum == reference
            print(f"run {i}: exit {rc}, " + ", ".join(
                f"{k} {v:.0f} ms" if v is not None else f"{k} -" for k, v in after.items()) +
                f", checksum {'as uninterrupted' if same else 'DIFFERS: ' + checksum}", flush=True)
            if rc != 0 or not same or killed != killed:
                sys.exit("the restarted job failed, differs, or ended before the kill")
            for k, v in after.items():
                if v is not None:
                    got[k].append(v)
        print(f"\nfrom the SIGKILL, over {args.runs} runs (min / median / max; load average at the start "
              f"{load[0]:.1f}, at the end {os.getloadavg()[0]:.1f}):")
        for k, v in got.items():
            if v:
                print(f"  {k:16} {min(v):6.0f} / {statistics.median(v):6.0f} / {max(v):6.0f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
