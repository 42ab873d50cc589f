#pragma once
//! \file
//! `Communicator`: the collectives accel needs, as an interface over a real engine: c10d Gloo on the CPU
//! (`comm/gloo.hpp`), NCCL on GPUs (`cuda/nccl.hpp`), with a timeout on every operation and errors that say
//! which rank, which operation and which peer. This header needs only ATen's `Tensor`: code that passes tensors
//! to a communicator (the collectives, the loaders, the models) does not see c10d; the engines do.
//!
//! Note [Dead peers]: every process runs a heartbeat (a counter in the rendezvous store, bumped twice a
//! second on a connection of its own; `comm/rendezvous.hpp`). When a collective fails or times out, the survivor
//! takes a census of the heartbeats and names the ranks that stopped; if the store itself is gone, rank 0 (which
//! hosts it) is the one that died. So a dead peer ends every survivor with an error such as
//!   accel: rank 0: all_reduce (collective #12) failed: Connection closed by peer. Not responding: rank 2.
//! within the configured timeout, never a hang.

#include <accel/error.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace accel {

//! A collective or the rendezvous failed (a peer died, never arrived, or timed out).
struct CommunicationError : Error {
  using Error::Error;
};

namespace comm {

enum class ReduceOp { sum, max, min };

//! Timeouts and rendezvous settings (the runtime knobs of the distributed slot).
struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};             //!< every collective
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};  //!< waiting for every process to arrive
  std::chrono::milliseconds heartbeat_interval{500};
};

using Clock = std::chrono::steady_clock;

//! The collectives of one process group. Shared, not copied; one engine implements it per `dist` tag.
class Communicator {
 public:
  Communicator(int rank, int size, CommOptions opt) : rank_(rank), size_(size), opt_(opt) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  //! Where tensors must be for this engine (the CPU for Gloo, the process's GPU for NCCL).
  [[nodiscard]] virtual c10::Device device() const { return c10::Device(c10::kCPU); }
  [[nodiscard]] const CommOptions& options() const noexcept { return opt_; }
  //! Number of collectives issued so far (error messages quote it).
  [[nodiscard]] std::uint64_t sequence() const noexcept { return seq_; }

  //! An all-reduce in flight (`all_reduce_start`); `finish` waits for it with the timeout.
  struct Pending {
    std::uint64_t sequence = 0;
    std::shared_ptr<void> native;  //!< the engine's own handle (Gloo: the c10d work; NCCL: the completion event)
  };
  //! Starts a sum all-reduce of `t` in place and returns at once (overlaps with the caller's work); the caller
  //! keeps `t` alive until `finish`.
  virtual Pending all_reduce_start(at::Tensor& t) = 0;
  //! Waits for an all-reduce started by `all_reduce_start`.
  virtual void finish(Pending& p) = 0;
  //! In place: every rank ends with the reduction of every rank's `t`.
  virtual void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  //! In place: every rank ends with `root`'s `t` (shapes and dtypes must already agree).
  virtual void broadcast(at::Tensor& t, int root = 0) = 0;
  //! Every rank's `t`, in rank order (shapes and dtypes must agree).
  virtual std::vector<at::Tensor> all_gather(const at::Tensor& t) = 0;
  //! `root` sends `chunks[r]` to rank r (all chunks the same shape); every rank receives into `out`.
  virtual void scatter(at::Tensor& out, const std::vector<at::Tensor>& chunks, int root = 0) = 0;
  //! Returns when every rank has called it.
  virtual void barrier() = 0;

 protected:
  //! Which other ranks stopped responding (the engine's rendezvous census), for error messages. Never throws.
  [[nodiscard]] virtual std::string census() const noexcept = 0;
  //! Throws the CommunicationError for collective `n` (`op`), with the census of the other ranks.
  [[noreturn]] void fail(const char* op, std::uint64_t n, std::string msg) const {
    if (const auto cut = msg.find('\n'); cut != std::string::npos) msg.resize(cut);  // drop c10's backtraces
    throw CommunicationError("accel: rank " + std::to_string(rank_) + ": " + op + " (collective #" + std::to_string(n) +
                             ", timeout " + std::to_string(opt_.timeout.count()) + " ms) failed: " + msg + ". " + census() + ".");
  }
  std::uint64_t next_sequence() noexcept { return ++seq_; }
  void check_root(int root, const char* op) const {
    detail::require(root >= 0 && root < size_, "accel: " + std::string(op) + " from rank " + std::to_string(root) +
                                                   ", but the job has ranks 0.." + std::to_string(size_ - 1));
  }

 private:
  int rank_, size_;
  CommOptions opt_;
  std::uint64_t seq_ = 0;
};

}  // namespace comm
}  // namespace accel
