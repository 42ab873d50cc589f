// Multi-process tests: started by accel-launch (or torchrun) as N real processes on 127.0.0.1; each checks every
// value it receives. `accel_mp_tests MODE [ARGS...]`, the modes:
//   collectives [SCRATCH]          comm/: gather, broadcast, reduce, padding, objects, splitting, main_process_first,
//   RNG sharding-collectives           comm/: reduce_scatter, all_gather_into, broadcast_coalesced (small and large)
//   zero SCRATCH                   optim/: ZeRO stages 1 and 2 equal DDP (5 optimizers, scaler, comm hooks), 1/N state,
//   consolidation, checkpoints, errors gather-for-metrics             comm/: gather_for_metrics with the plan's layouts
//   (even and uneven tails) golden FILE [WORKERS]          data/: Accelerate's end-to-end vectors of this world size,
//   sharded and dispatched golden-stream FILE [WORKERS]   data/: the same with the data given as a stream (an iterable
//   dataset) dispatch                       data/: dispatched loading's transport (<= 1/N of a broadcast), slices,
//   errors streams                        data/: streams of unknown length (no size(), a file, endless) on every path,
//   cut, resumed ddp                            model/: DistributedModule equals one process on the concatenated
//   batches ddp-buffers FILE               model/: DDP's buffer broadcast, against a PyTorch DDP job's golden vectors
//   fsdp FILE | fsdp-edges SCRATCH  model/: full sharding against PyTorch's fully_shard; its memory, misuse,
//   checkpoints comm-hooks                     model/: fp16 and bf16 gradient compression against the hook's average
//   activation-checkpointing       model/: checkpointed blocks train as plain ones under full sharding and DDP
//   sync-bn                        model/: SyncBatchNorm equals BatchNorm on the concatenated batch
//   replicas                       model/: the door (model(x)), an unprepared optimizer, backward without
//                                  accumulate, and replicas that drift, each found
//   training                       the Accelerator: prepare + accumulate + backward, the scheduler, the GradScaler
//   helpers                        the Accelerator's helpers: triggers, clip_grad_value_, gather_for_metrics of
//   objects, on_* uneven                         tail::uneven training and evaluation joined from the plan (Join's
//   semantics) kill | train-kill              the last rank SIGKILLs itself mid-collective / mid-training (survivors
//   must fail fast) dead-peer [open]               the others wait for the last rank in an all_reduce; fault.sh
//   SIGKILLs it (with `open`,
//                                  a child of it keeps its sockets open): they must leave at once, naming it
//   rendezvous [TIMEOUT_MS]        just connect (used to start a job one process short)
//   freeze [PEER_TIMEOUT_MS]       the last rank SIGSTOPs itself mid-training (survivors must name it within the peer
//   timeout) busy [MS]                      the last rank computes for MS before an all_reduce (a busy peer is not a
//   frozen one) files SCRATCH                  trackers and save_model: only rank 0 writes, every rank finds its files
//   complete resize-loaders save|resume DIR [STOP]   data/: loaders checkpointed at one size, resumed at another
//   (resize.sh) resize-training save|resume DIR [STOP]  data/: training checkpointed at one size, resumed at another
//   (resize.sh) mismatch op|kind|reduce-scatter|gather-start|size|tiny        odd ranks issue another collective than
//   even ones (every rank must name both) elastic DIR [EPOCHS] [EVERY] [R:S[:G]]  training checkpointed to DIR every
//   EVERY batches, resumed from DIR when it
//                                  exists; rank R SIGKILLs itself before batch S in generations below G; prints the
//                                  parameter checksum (accel-launch on several nodes, --max-restarts: launch.sh)
//   preemptible PROJECT [EPOCHS] [PACE_MS] [R:S:SIGNAL]  training under a checkpoint policy and Options::preemption,
//                                  resumed from the project's latest checkpoint; rank R raises SIGNAL after batch S
//                                  (preemption.sh signals it, or its launcher, and compares the checksums)
//   surface                        every socket the job's processes listen on is a loopback one (security.sh)
//   foreign-writer PORT SECONDS    a client outside the job overwrites every key it finds in the store at PORT
//   attacked SECONDS               all_reduces for SECONDS, every result checked (while foreign-writer runs)
//   job-sum VALUE                  all_reduces of VALUE: one of two jobs sharing a store (ACCEL_JOB_ID)
//   store-host PORT SECONDS        hosts a bare store (the agent store of job-sum's two jobs)
//   nccl                           cuda/: the NCCL engine, one GPU per process: every collective, RNG synchronisation,
//                                  DDP training (prints "SKIPPED: ..." and exits 77 without 2 GPUs or without CUDA)
// Each rank ends with "rank R: N passed, M failed" and exits non-zero on any failure.
#include "harness.hpp"

#include <cstdlib>
#include <iostream>
#include <map>

int main(int argc, char** argv) {
  const std::map<std::string, void (*)(const mp::Args&)> modes{{"collectives", mp::collectives},
                                                               {"gather-for-metrics", mp::gather_for_metrics},
                                                               {"golden", mp::golden_e2e},
                                                               {"golden-stream", mp::golden_e2e_stream},
                                                               {"dispatch", mp::dispatch},
                                                               {"ddp", mp::distributed_module},
                                                               {"training", mp::accelerator},
                                                               {"kill", mp::kill_mid_collective},
                                                               {"train-kill", mp::kill_mid_training},
                                                               {"rendezvous", mp::rendezvous},
                                                               {"elastic", mp::elastic},
                                                               {"preemptible", mp::preemptible},
                                                               {"freeze", mp::freeze_mid_training},
                                                               {"large-gather-fault", mp::large_all_gather_fault},
                                                               {"busy", mp::busy_peer},
                                                               {"mismatch", mp::mismatch},
                                                               {"uneven", mp::uneven},
                                                               {"ddp-buffers", mp::ddp_buffers},
                                                               {"fsdp", mp::fully_sharded},
                                                               {"fsdp-edges", mp::fully_sharded_edges},
                                                               {"fsdp-bypass", mp::fully_sharded_bypass},
                                                               {"fsdp-checkpoints", mp::fully_sharded_checkpoints},
                                                               {"fsdp-mixed", mp::fully_sharded_mixed},
                                                               {"activation-checkpointing", mp::checkpointed_units},
                                                               {"fsdp-kill", mp::fully_sharded_kill},
                                                               {"comm-hooks", mp::comm_hooks},
                                                               {"sync-bn", mp::sync_batch_norm},
                                                               {"surface", mp::listening_surface},
                                                               {"foreign-writer", mp::foreign_writer},
                                                               {"attacked", mp::attacked_job},
                                                               {"job-sum", mp::job_sum},
                                                               {"store-host", mp::store_host},
                                                               {"files", mp::files},
                                                               {"helpers", mp::helpers},
                                                               {"resize-loaders", mp::resize_loaders},
                                                               {"resize-training", mp::resize_training},
                                                               {"sharding-collectives", mp::sharding_collectives},
                                                               {"zero", mp::zero},
                                                               {"replicas", mp::replicas},
                                                               {"dead-peer", mp::dead_peer},
                                                               {"streams", mp::streams},
                                                               {"nccl", mp::nccl}};
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  const auto it = modes.find(mode);
  if (it == modes.end()) {
    std::cerr << "unknown mode " << mode << "; the modes are:";
    for (const auto& [name, f] : modes) std::cerr << " " << name;
    std::cerr << "\n";
    return 2;
  }
  try {
    it->second(mp::Args(argv + std::min(argc, 2), argv + argc));
  } catch (const accel::CommunicationError& e) {
    std::cerr << e.what() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 4;
  }
  std::cout << "rank " << mp::tally.rank << ": " << mp::tally.passed << " passed, " << mp::tally.failed << " failed"
            << std::endl;
  accel::ProcessState::reset();
  return mp::tally.failed == 0 ? 0 : 1;
}
