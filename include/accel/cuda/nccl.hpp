#pragma once
//! \file
//! CUDA specialisation of the distributed slot: a `Communicator` that drives NCCL directly on accel's own
//! CUDA stream (the NCCL unique id travels through the rendezvous store). `Engine<dist::nccl>`
//! (state/engine.hpp) builds it; that header includes this one whenever ACCEL_WITH_CUDA is set.
//!
//! Note [Never hang on NCCL]: every NCCL call is issued non-blocking; accel polls the stream and the
//! communicator's async error until `CommOptions::timeout`, then aborts the communicator and throws, so a
//! dead peer ends every survivor with an error (and a census, see communicator.hpp) instead of a hang.

#if !ACCEL_WITH_CUDA
#error "<accel/cuda/nccl.hpp> needs ACCEL_WITH_CUDA (a CUDA build of LibTorch and the CUDA toolkit)"
#endif

#include <accel/comm/communicator.hpp>
#include <accel/cuda/connect.hpp>
#include <accel/state/rendezvous/rendezvous.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

//! What needs the CUDA runtime or NCCL (ACCEL_WITH_CUDA builds only): the NCCL engine and the side stream of
//! asynchronous placement.
namespace accel::cuda {

//! Throws an `Error` naming `what` if `e` is a CUDA error.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("accel: CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

//! NCCL's type for a tensor dtype (an `InvalidArgument` for one NCCL cannot reduce).
inline ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
    case at::kBool:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      throw InvalidArgument(std::string("accel: NCCL cannot reduce tensors of type ") + c10::toString(t));
  }
}

//! NCCL on one GPU per process, on accel's own stream.
class NcclCommunicator final : public comm::Communicator {
 public:
  //! Takes the rendezvous (kept: its heartbeat watches the peers), creates the NCCL communicator from rank 0's id
  //! through its store, on GPU `device`, and checks it with a one-element all-reduce.
  NcclCommunicator(std::unique_ptr<rendezvous::Rendezvous> rdzv, const rendezvous::RendezvousSpec& spec,
                   comm::CommOptions opt, int device)
      : Communicator(spec.rank, spec.size, opt, rdzv.get()), rdzv_(std::move(rdzv)), device_(device) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    // The unique id: drawn by rank 0, shared through the rendezvous store.
    const auto n = begin(comm::OpKind::barrier, at::kByte, 0);  // ncclCommInitRank: every rank takes part
    ncclUniqueId id;
    auto store = rdzv_->store();
    if (rank() == 0) {
      check_nccl(ncclGetUniqueId(&id), n);
      store->set("accel/nccl/id",
                 std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id));
    } else {
      const auto bytes = store->get("accel/nccl/id");
      if (bytes.size() != sizeof id)
        throw CommunicationError("accel: rank " + std::to_string(rank()) + ": the NCCL id in the rendezvous store is " +
                                 std::to_string(bytes.size()) + " bytes, not " + std::to_string(sizeof id) +
                                 " (written by another NCCL version, or by a client outside the job)");
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, size(), id, rank(), &config), n);
    wait_comm(n);
    rdzv_->settled();
  }
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void all_reduce(at::Tensor& t, comm::ReduceOp op = comm::ReduceOp::sum) override {
    require_cuda(t, "all_reduce");
    const ncclRedOp_t rop = op == comm::ReduceOp::sum ? ncclSum : op == comm::ReduceOp::max ? ncclMax : ncclMin;
    launch(begin(comm::OpKind::all_reduce, t.scalar_type(), t.numel(), op), [&] {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t.scalar_type()), rop, comm_,
                           stream_);
    });
  }
  // The gradient-bucket path: the all-reduce is queued on accel's stream after the work already on the caller's
  // stream, and `finish` polls its completion event against the timeout, then orders the caller's stream after it.
  // The caller keeps `t` alive until `finish` (DistributedModule's bucket does).
  Pending all_reduce_start(at::Tensor& t) override {
    require_cuda(t, "all_reduce");
    return start(begin(comm::OpKind::all_reduce, t.scalar_type(), t.numel()), [&] {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t.scalar_type()), ncclSum, comm_,
                           stream_);
    });
  }
  //! ncclReduce in place (ZeRO stage 2's gradient buckets), queued and finished as `all_reduce_start`.
  Pending reduce_start(at::Tensor& buffer, std::int64_t payload, int root) override {
    require_cuda(buffer, "reduce");
    check_root(root, "reduce");
    return start(begin(comm::OpKind::reduce, buffer.scalar_type(), payload, comm::ReduceOp::sum, root), [&] {
      return ncclReduce(buffer.data_ptr(), buffer.data_ptr(), size_t(payload), nccl_type(buffer.scalar_type()), ncclSum,
                        root, comm_, stream_);
    });
  }
  void finish(Pending& p) override {
    if (!p.native) return;
    const auto& f = *static_cast<InFlight*>(p.native.get());
    const cudaEvent_t done = *static_cast<cudaEvent_t*>(f.event.get());
    wait_event(done, f.id);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const cudaStream_t current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    check_cuda(cudaStreamWaitEvent(current, done, 0), "cudaStreamWaitEvent");
    p.native.reset();
  }
  void broadcast(at::Tensor& t, int root = 0) override {
    require_cuda(t, "broadcast");
    check_root(root, "broadcast");
    launch(begin(comm::OpKind::broadcast, t.scalar_type(), t.numel(), comm::ReduceOp::sum, root), [&] {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t.scalar_type()), root, comm_,
                           stream_);
    });
  }
  std::vector<at::Tensor> all_gather(const at::Tensor& t) override {
    require_cuda(t, "all_gather");
    const at::Tensor in = t.contiguous();
    auto shape = in.sizes().vec();
    shape.insert(shape.begin(), size());
    at::Tensor out = at::empty(shape, in.options());
    launch(begin(comm::OpKind::all_gather, in.scalar_type(), in.numel()), [&] {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), nccl_type(in.scalar_type()), comm_,
                           stream_);
    });
    std::vector<at::Tensor> parts;
    for (int r = 0; r < size(); ++r) parts.push_back(out[r]);
    return parts;
  }
  void scatter(at::Tensor& out, const std::vector<at::Tensor>& chunks, int root = 0) override {
    require_cuda(out, "scatter");
    check_root(root, "scatter");
    const auto type = nccl_type(out.scalar_type());
    launch(begin(comm::OpKind::scatter, out.scalar_type(), out.numel(), comm::ReduceOp::sum, root), [&] {
      ncclGroupStart();
      if (rank() == root)
        for (int r = 0; r < size(); ++r)
          ncclSend(chunks[std::size_t(r)].data_ptr(), size_t(chunks[std::size_t(r)].numel()), type, r, comm_, stream_);
      const ncclResult_t res = ncclRecv(out.data_ptr(), size_t(out.numel()), type, root, comm_, stream_);
      const ncclResult_t end = ncclGroupEnd();
      return res != ncclSuccess ? res : end;
    });
  }
  //! ncclReduceScatter (sum) of the 1-d `input` into this rank's part `out`.
  void reduce_scatter(at::Tensor& out, const at::Tensor& input) override {
    const at::Tensor in = checked_parts(out, input, input, "reduce_scatter");
    into(out, begin(comm::OpKind::reduce_scatter, out.scalar_type(), out.numel()), [&](at::Tensor& o) {
      return ncclReduceScatter(in.data_ptr(), o.data_ptr(), size_t(o.numel()), nccl_type(o.scalar_type()), ncclSum,
                               comm_, stream_);
    });
  }
  //! ncclAllGather into `out` (in place when `part` is `out`'s own slice, which NCCL supports).
  void all_gather_into(at::Tensor& out, const at::Tensor& part) override {
    const at::Tensor in = checked_parts(part, out, part, "all_gather_into");
    into(out, begin(comm::OpKind::all_gather, in.scalar_type(), in.numel()), [&](at::Tensor& o) {
      return ncclAllGather(in.data_ptr(), o.data_ptr(), size_t(in.numel()), nccl_type(in.scalar_type()), comm_,
                           stream_);
    });
  }
  //! The same queued on accel's stream after the caller's work and finished as `all_reduce_start` (`finish` polls
  //! its event against the timeout, then orders the caller's stream after it); the tensors are held until then. An
  //! `out` that is not contiguous is gathered by the blocking one.
  Pending all_gather_into_start(at::Tensor& out, const at::Tensor& part) override {
    const at::Tensor in = checked_parts(part, out, part, "all_gather_into");
    if (!out.is_contiguous()) {
      all_gather_into(out, part);
      return {sequence(), nullptr};
    }
    Pending p = start(begin(comm::OpKind::all_gather, in.scalar_type(), in.numel()), [&] {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), nccl_type(in.scalar_type()), comm_,
                           stream_);
    });
    static_cast<InFlight*>(p.native.get())->held = {in, out};
    return p;
  }
  // broadcast_coalesced: the base class's packing into one ncclBroadcast of bytes.

  void barrier() override {
    at::Tensor one = at::ones({1}, at::TensorOptions().device(at::kCUDA, device_).dtype(at::kFloat));
    all_reduce(one, comm::ReduceOp::sum);
  }

  //! accel's own stream, where its collectives run.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] c10::Device device() const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }

 private:
  // Queues `call` (an NCCL collective on accel's stream) after the work already on the caller's stream and
  // returns its completion event, which `finish` polls against the timeout.
  template <class Call>
  Pending start(const comm::CollectiveId& n, Call&& call) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    enqueue(n, std::forward<Call>(call));
    cudaEvent_t* done = new cudaEvent_t;
    check_cuda(cudaEventCreateWithFlags(done, cudaEventDisableTiming), "cudaEventCreate");
    std::shared_ptr<void> event(done, [](void* e) {
      cudaEventDestroy(*static_cast<cudaEvent_t*>(e));
      delete static_cast<cudaEvent_t*>(e);
    });
    check_cuda(cudaEventRecord(*done, stream_), "cudaEventRecord");
    return {n.seq, std::make_shared<InFlight>(InFlight{n, std::move(event), {}})};
  }
  struct InFlight {
    comm::CollectiveId id;
    std::shared_ptr<void> event;
    std::vector<at::Tensor> held;  // what the collective reads and writes, alive until `finish`
  };

  //! A reduce_scatter's or all_gather_into's tensors: on this GPU, `part` 1/N of `whole`; returns `input` contiguous.
  at::Tensor checked_parts(const at::Tensor& part, const at::Tensor& whole, const at::Tensor& input,
                           const char* op) const {
    require_cuda(part, op);
    require_cuda(whole, op);
    check_parts(part, whole, op);
    return input.contiguous();
  }
  //! Runs `call(o)` as collective `id` into a contiguous `o`: `out` itself, or a buffer copied into it afterwards.
  template <class Call>
  void into(at::Tensor& out, const comm::CollectiveId& id, Call&& call) {
    const bool direct = out.is_contiguous();
    at::Tensor o = direct ? out : at::empty({out.numel()}, out.options());
    launch(id, [&] { return call(o); });
    if (!direct) out.copy_(o);
  }
  void require_cuda(const at::Tensor& t, const char* op) const {
    detail::require(t.is_cuda(), std::string("accel: NCCL ") + op +
                                     " needs CUDA tensors; move the tensor to the "
                                     "process's device (state.device()) first");
  }
  void check_nccl(ncclResult_t r, const comm::CollectiveId& n) {
    if (r != ncclSuccess && r != ncclInProgress)
      fail(n, std::string(ncclGetErrorString(r)) + " (" + ncclGetLastError(comm_) + ")");
  }
  // Waits until the communicator has no operation in progress, or aborts it at the timeout.
  void wait_comm(const comm::CollectiveId& n) {
    Watch watch(*this, n);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (comm_) ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) abort_and_fail(n, ncclGetErrorString(state));
      watch.check();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Queues `call` on accel's stream after the work already on the caller's stream (under the caller's CUDAGuard of
  // this device) and waits for NCCL to accept it; returns the caller's stream.
  template <class Call>
  cudaStream_t enqueue(const comm::CollectiveId& n, Call&& call) {
    const cudaStream_t current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    check_cuda(cudaEventRecord(ready_, current), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    check_nccl(call(), n);
    wait_comm(n);
    return current;
  }
  // Orders the collective after the work already queued on the caller's stream, runs it on ours, makes the
  // caller's stream wait for it, and polls for completion against the timeout.
  template <class Call>
  void launch(const comm::CollectiveId& n, Call&& call) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const cudaStream_t current = enqueue(n, std::forward<Call>(call));
    check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
    wait_event(done_, n);
    check_cuda(cudaStreamWaitEvent(current, done_, 0), "cudaStreamWaitEvent");
  }
  // Polls `event` until it completes; an NCCL error or the timeout aborts the communicator.
  void wait_event(cudaEvent_t event, const comm::CollectiveId& n) {
    Watch watch(*this, n);
    for (;;) {
      const cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) abort_and_fail(n, cudaGetErrorString(q));
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) abort_and_fail(n, ncclGetErrorString(state));
      watch.check();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // The polling loops' side of Notes [Frozen peers] and [Ended ranks]: every quick look, whether a launcher
  // reported a rank that ended, and after a second the heartbeat's verdict; the timeout, a frozen or ended peer or
  // a mismatch aborts the communicator and throws.
  class Watch {
   public:
    Watch(NcclCommunicator& c, const comm::CollectiveId& id)
        : c_(c), id_(id), t0_(comm::Clock::now()), next_(t0_ + c.options().quick_look()) {}
    void check() {
      const auto now = comm::Clock::now();
      if (now < next_) return;
      next_ = now + c_.options().quick_look();
      if (now - t0_ > c_.options().timeout) c_.abort_and_fail(id_, "timed out");
      if (!c_.monitor()) return;
      if (!waiting_) waiting_ = c_.monitor()->waiting();
      if (!watching_ && now - t0_ >= std::chrono::seconds(1)) watching_ = c_.monitor()->watch();
      if (const comm::Finding f = watching_ ? c_.monitor()->verdict(id_) : c_.monitor()->ended()) {
        c_.abort();
        c_.fail_found(id_, f, std::chrono::duration_cast<std::chrono::milliseconds>(now - t0_));
      }
    }

   private:
    NcclCommunicator& c_;
    comm::CollectiveId id_;
    comm::Clock::time_point t0_, next_;
    std::shared_ptr<void> waiting_, watching_;
  };
  void abort() noexcept {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  [[noreturn]] void abort_and_fail(const comm::CollectiveId& n, const std::string& why) {
    abort();
    fail(n, why);
  }

  std::unique_ptr<rendezvous::Rendezvous> rdzv_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace accel::cuda

#if ACCEL_DEFINITIONS
#include <accel/cuda/impl/nccl.ipp>
#endif
