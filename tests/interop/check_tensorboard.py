#!/usr/bin/env python3
"""accel's tracker files read by their readers (run by ctest as interop.tensorboard).

    check_tensorboard.py ACCEL_INTEROP_TESTS WORK_DIR

accel_interop_tests track runs init_trackers("run", {lr: 0.1, batch_size: 32, optimizer: "adamw"}) and logs
steps 100..109: loss = 1/(s+1), lr = 0.1 * 0.5**s, epoch = s // 3 on every third call, and the text
'warm, "done"' as "phase" at s = 4. TensorBoard's EventAccumulator and event file loader must find exactly those
tags, steps and values (scalars are float32 in TensorBoard), the file version first and the configuration as a
text summary and as the hparams plugin's data; the JSONL and CSV files must parse with json and csv to the same values.

accel_interop_tests track-resume runs that logging twice: uninterrupted, and stopped after a checkpoint at step 105
(steps 106..109 logged after it, a text at 107 among them) then resumed from it. TensorBoard must read the same
(tag, step, value) from both folders, none twice: scalars through the EventAccumulator, every series (text too)
through the plugin_event_accumulator that TensorBoard's Python data path uses; the JSONL and CSV files must be equal.
Prints "N passed, M failed"; exits 1 on any failure.
"""
import csv
import json
import logging
import os
import subprocess

import numpy as np
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.util import tensor_util

from tally import arguments, check, finish

tool, work = arguments()
logging.getLogger("tensorboard").setLevel(logging.ERROR)  # its notes on purged steps: expected here, not failures

subprocess.run([tool, "track", str(work)], check=True)
run = work / "run"
steps = list(range(100, 110))
loss = {100 + s: 1 / (s + 1) for s in range(10)}
lr = {100 + s: 0.1 * 0.5 ** s for s in range(10)}
epoch = {100 + s: s // 3 for s in range(0, 10, 3)}

# ---- TensorBoard ----------------------------------------------------------------------------------------------
events = [f for f in os.listdir(run) if f.startswith("events.out.tfevents.")]
check(len(events) == 1, f"one event file, found {events}")
raw = list(EventFileLoader(str(run / events[0])).Load())
check(raw[0].file_version == "brain.Event:2", f"first event: {raw[0]}")
check(all(e.wall_time > 1e9 for e in raw), "every event has a wall time")
check(all(b.wall_time >= a.wall_time for a, b in zip(raw, raw[1:])), "wall times do not go back")
acc = ea.EventAccumulator(str(run), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
tags = acc.Tags()
check(sorted(tags["scalars"]) == ["epoch", "loss", "lr"], f"scalar tags {tags['scalars']}")
for tag, want in (("loss", loss), ("lr", lr), ("epoch", epoch)):
    got = {e.step: e.value for e in acc.Scalars(tag)}
    check(sorted(got) == sorted(want), f"{tag} steps {sorted(got)}")
    check(all(got.get(s) == float(np.float32(v)) for s, v in want.items()), f"{tag} values {got} != {want}")
check(sorted(tags["tensors"]) == ["_hparams_/experiment", "_hparams_/session_start_info", "config", "phase"],
      f"tensor tags {tags['tensors']}")
phase = acc.Tensors("phase")
check([e.step for e in phase] == [104], "phase logged once, at step 104")
check(phase[0].tensor_proto.string_val[0].decode() == 'warm, "done"', f"phase text {phase[0].tensor_proto}")
check(acc.SummaryMetadata("phase").plugin_data.plugin_name == "text", "phase is a text summary")
config = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
for row in ("| lr | 0.1 |", "| batch_size | 32 |", "| optimizer | adamw |"):
    check(row in config, f"config text lacks {row!r}: {config!r}")

# The hparams plugin's data: the experiment's names and types, the session's values.
experiment = plugin_data_pb2.HParamsPluginData.FromString(acc.SummaryMetadata("_hparams_/experiment").plugin_data.content)
check(acc.SummaryMetadata("_hparams_/experiment").plugin_data.plugin_name == "hparams", "hparams plugin name")
infos = {i.name: i.type for i in experiment.experiment.hparam_infos}
check(infos == {"batch_size": api_pb2.DATA_TYPE_FLOAT64, "lr": api_pb2.DATA_TYPE_FLOAT64, "optimizer": api_pb2.DATA_TYPE_STRING},
      f"hparam infos {infos}")
session = plugin_data_pb2.HParamsPluginData.FromString(acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content)
values = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in session.session_start_info.hparams.items()}
check(values == {"batch_size": 32.0, "lr": 0.1, "optimizer": "adamw"}, f"session hparams {values}")
check(session.session_start_info.start_time_secs > 1e9, "session start time")

# ---- JSONL and CSV --------------------------------------------------------------------------------------------
lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
check([x["step"] for x in lines] == steps, "JSONL steps")
check(all(x["loss"] == loss[x["step"]] and x["lr"] == lr[x["step"]] for x in lines), "JSONL values (exact doubles)")
check([x["step"] for x in lines if "epoch" in x] == sorted(epoch), "JSONL epoch only where logged")
check(lines[4]["phase"] == 'warm, "done"', "JSONL text")
with open(run / "metrics.csv", newline="") as f:
    rows = list(csv.DictReader(f))
check(list(rows[0]) == ["step", "epoch", "loss", "lr", "phase"], f"CSV columns {list(rows[0])}")
check([int(r["step"]) for r in rows] == steps, "CSV steps")
check(all(float(r["loss"]) == loss[int(r["step"])] and float(r["lr"]) == lr[int(r["step"])] for r in rows), "CSV values")
check([r["epoch"] for r in rows] == [str(epoch[s]) if s in epoch else "" for s in steps], "CSV epoch cells")
check([r["phase"] for r in rows] == ['warm, "done"' if s == 104 else "" for s in steps], "CSV text cells")
check(json.loads((run / "config.json").read_text()) == {"batch_size": 32, "lr": 0.1, "optimizer": "adamw"}, "config.json")

# ---- a resumed run reads as an uninterrupted one ----------------------------------------------------------------
subprocess.run([tool, "track-resume", str(work / "resume")], check=True)
straight, resumed = work / "resume" / "straight" / "run", work / "resume" / "resumed" / "run"
events = sorted(f for f in os.listdir(resumed) if f.startswith("events.out.tfevents."))
check(len(events) == 2, f"the stopped job's event file and the resumed job's, found {events}")
newest = list(EventFileLoader(str(resumed / events[-1])).Load())
check(newest[0].file_version == "brain.Event:2" and newest[0].step == 106, f"the resumed file's version at step 106: {newest[0]}")
check(newest[1].session_log.status == newest[1].session_log.START and newest[1].step == 106,
      f"the resumed file's session start at step 106: {newest[1]}")


def scalars(run):  # (tag, step, value) as the EventAccumulator reads them, in order
    acc = ea.EventAccumulator(str(run), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0}).Reload()
    return sorted((tag, e.step, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))


def series(run):  # every series (scalars migrated to tensors, texts, the configuration) as TensorBoard serves them
    acc = pea.EventAccumulator(str(run), size_guidance={pea.TENSORS: 0}).Reload()
    return sorted((tag, e.step, repr(tensor_util.make_ndarray(e.tensor_proto).tolist()))
                  for tag in acc.Tags()["tensors"] for e in acc.Tensors(tag))


want = scalars(straight)
check(len(want) == 20 and scalars(resumed) == want, f"EventAccumulator scalars: resumed {scalars(resumed)} != {want}")
want = series(straight)
check([t for t in want if t[0] == "note"] == [("note", 107, repr(b"after the checkpoint"))], f"the text at 107: {want}")
check(series(resumed) == want, f"plugin_event_accumulator series: resumed {series(resumed)} != {want}")
for name in ("metrics.jsonl", "metrics.csv", "config.json"):
    check((resumed / name).read_bytes() == (straight / name).read_bytes(), f"{name} of the resumed run differs")

finish()
