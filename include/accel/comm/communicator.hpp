#pragma once
//! \file
//! `Communicator`: the collectives accel needs, over a real engine (c10d Gloo on the CPU, NCCL on GPUs),
//! with a timeout on every operation and errors that say which rank, which operation and which peer.
//!
//! Note [Dead peers]: every process runs a heartbeat (a counter in the rendezvous store, bumped twice a
//! second on a connection of its own). When a collective fails or times out, the survivor takes a census of
//! the heartbeats and names the ranks that stopped; if the store itself is gone, rank 0 (which hosts it)
//! is the one that died. So a dead peer ends every survivor with an error such as
//!   accel: rank 0: all_reduce (collective #12) failed: Connection closed by peer. Not responding: rank 2.
//! within the configured timeout, never a hang.

#include <accel/error.hpp>
#include <accel/state/launch_env.hpp>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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

//! The rendezvous: a TCPStore hosted by rank 0, every rank announcing itself, and a census of heartbeats.
class Rendezvous {
 public:
  Rendezvous(const LaunchEnv& env, const CommOptions& opt)
      : addr_(env.master_addr), port_(env.master_port), rank_(env.rank), size_(env.world_size), opt_(opt) {
    const int rank = rank_, size = size_;
    const auto t0 = Clock::now();
    try {
      store_ = connect(opt.rendezvous_timeout, rank == 0 && !env.agent_store);
    } catch (const std::exception& e) {
      throw CommunicationError("accel: rank " + std::to_string(rank) + ": could not reach the rendezvous store at " + where() +
                               " within " + seconds(opt.rendezvous_timeout) + " (rank 0 hosts it: is it running, and are "
                               "MASTER_ADDR/MASTER_PORT the same on every process?): " + e.what());
    }
    store_->set(arrived_key(rank), std::vector<uint8_t>{1});
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(arrived_key(r));
    const auto left = opt.rendezvous_timeout - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    try {
      store_->wait(keys, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      std::string missing;
      int arrived = 0;
      for (int r = 0; r < size; ++r) {
        if (store_->check({arrived_key(r)})) ++arrived;
        else missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw CommunicationError("accel: rank " + std::to_string(rank) + ": rendezvous at " + where() + ": only " +
                               std::to_string(arrived) + " of " + std::to_string(size) + " processes arrived within " +
                               seconds(opt.rendezvous_timeout) + "; missing rank(s): " + missing +
                               ". Start all " + std::to_string(size) + " processes (accel-launch --nproc-per-node), or "
                               "check WORLD_SIZE");
    }
    heartbeat_ = std::thread([this] { beat(); });
  }

  ~Rendezvous() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  [[nodiscard]] c10::intrusive_ptr<c10d::Store> store() const noexcept { return store_; }
  [[nodiscard]] std::string where() const { return addr_ + ":" + std::to_string(port_); }

  //! Records that this rank failed (so that other ranks' censuses do not take it for dead), then reports which
  //! other ranks stopped beating without reporting a failure. Takes about three heartbeat intervals; never throws.
  [[nodiscard]] std::string census() const noexcept {
    try {
      auto probe = connect(opt_.heartbeat_interval * 4, false);
      probe->set(failed_key(rank_), std::vector<uint8_t>{1});
      auto read = [&] {
        std::vector<int64_t> v;
        for (int r = 0; r < size_; ++r) v.push_back(probe->add(heartbeat_key(r), 0));
        return v;
      };
      const auto before = read();
      std::this_thread::sleep_for(opt_.heartbeat_interval * 3);
      const auto after = read();
      std::string dead, failed;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        if (probe->check({failed_key(r)})) failed += (failed.empty() ? "rank " : ", rank ") + std::to_string(r);
        else if (after[std::size_t(r)] == before[std::size_t(r)]) dead += (dead.empty() ? "rank " : ", rank ") + std::to_string(r);
      }
      std::string out = dead.empty() ? "no rank stopped responding (a timeout, or ranks in different operations?)"
                                     : "not responding: " + dead;
      if (!failed.empty()) out += "; also failed: " + failed;
      return out;
    } catch (const std::exception&) {
      return rank_ == 0 ? "the rendezvous store is gone" : "not responding: rank 0 (it hosts the rendezvous store)";
    }
  }

 private:
  static std::string seconds(std::chrono::milliseconds ms) { return std::to_string(double(ms.count()) / 1000.0).substr(0, 5) + " s"; }
  static std::string arrived_key(int r) { return "accel/arrived/" + std::to_string(r); }
  static std::string heartbeat_key(int r) { return "accel/heartbeat/" + std::to_string(r); }
  static std::string failed_key(int r) { return "accel/failed/" + std::to_string(r); }

  c10::intrusive_ptr<c10d::TCPStore> connect(std::chrono::milliseconds timeout, bool server) const {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port_);
    o.isServer = server;
    o.waitWorkers = false;
    o.timeout = timeout;
    return c10::make_intrusive<c10d::TCPStore>(addr_, o);
  }

  void beat() {
    c10::intrusive_ptr<c10d::TCPStore> own;
    try {
      own = connect(opt_.rendezvous_timeout, false);
    } catch (const std::exception&) {
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      try {
        own->add(heartbeat_key(rank_), 1);
      } catch (const std::exception&) {
        return;  // the store is gone (rank 0 exited): the next collective reports it
      }
      cv_.wait_for(lock, opt_.heartbeat_interval, [this] { return stop_; });
    }
  }

  std::string addr_;
  int port_, rank_, size_;
  CommOptions opt_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::thread heartbeat_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

//! The collectives of one process group: over a c10d `Backend` (Gloo); `accel/cuda/nccl.hpp` overrides them
//! with NCCL on accel's own stream. Shared, not copied.
class Communicator {
 public:
  Communicator(std::unique_ptr<Rendezvous> rdzv, c10::intrusive_ptr<c10d::Backend> backend, int rank, int size,
               CommOptions opt)
      : rdzv_(std::move(rdzv)), backend_(std::move(backend)), rank_(rank), size_(size), opt_(opt) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  //! Where tensors must be for this engine (the CPU for Gloo, the process's GPU for NCCL).
  [[nodiscard]] virtual c10::Device device() const { return c10::Device(c10::kCPU); }
  [[nodiscard]] const CommOptions& options() const noexcept { return opt_; }
  [[nodiscard]] const c10::intrusive_ptr<c10d::Backend>& backend() const noexcept { return backend_; }
  [[nodiscard]] const Rendezvous& rendezvous() const noexcept { return *rdzv_; }
  //! Number of collectives issued so far (error messages quote it).
  [[nodiscard]] std::uint64_t sequence() const noexcept { return seq_; }

  //! An all-reduce in flight (`all_reduce_start`); `finish` waits for it with the timeout.
  struct Pending {
    c10::intrusive_ptr<c10d::Work> work;
    std::uint64_t sequence = 0;
    std::shared_ptr<void> native;  //!< the specialisation's own handle (NCCL: the completion event)
  };
  //! Starts a sum all-reduce of `t` in place and returns at once (overlaps with the caller's work).
  virtual Pending all_reduce_start(at::Tensor& t) {
    const auto n = ++seq_;
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.timeout = opt_.timeout;
    try {
      return {backend_->allreduce(v, o), n};
    } catch (const std::exception& e) {
      fail("all_reduce", n, e.what());
    }
  }
  //! Waits for an all-reduce started by `all_reduce_start`.
  virtual void finish(Pending& p) {
    if (!p.work) return;
    try {
      if (!p.work->wait(opt_.timeout)) throw std::runtime_error("timed out");
    } catch (const std::exception& e) {
      p.work.reset();
      fail("all_reduce", p.sequence, e.what());
    }
    p.work.reset();
  }
  //! In place: every rank ends with the reduction of every rank's `t`.
  virtual void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::sum) {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = op == ReduceOp::sum ? c10d::ReduceOp::SUM : op == ReduceOp::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::MIN;
    o.timeout = opt_.timeout;
    run("all_reduce", [&] { return backend_->allreduce(v, o); });
  }
  //! In place: every rank ends with `root`'s `t` (shapes and dtypes must already agree).
  virtual void broadcast(at::Tensor& t, int root = 0) {
    check_root(root, "broadcast");
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = opt_.timeout;
    run("broadcast", [&] { return backend_->broadcast(v, o); });
  }
  //! Every rank's `t`, in rank order (shapes and dtypes must agree).
  virtual std::vector<at::Tensor> all_gather(const at::Tensor& t) {
    std::vector<at::Tensor> in{t.contiguous()};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(at::empty_like(in[0]));
    c10d::AllgatherOptions o;
    o.timeout = opt_.timeout;
    run("all_gather", [&] { return backend_->allgather(out, in, o); });
    return std::move(out[0]);
  }
  //! `root` sends `chunks[r]` to rank r (all chunks the same shape); every rank receives into `out`.
  virtual void scatter(at::Tensor& out, const std::vector<at::Tensor>& chunks, int root = 0) {
    check_root(root, "scatter");
    std::vector<at::Tensor> o{out};
    std::vector<std::vector<at::Tensor>> in;
    if (rank_ == root) in.push_back(chunks);
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    opts.timeout = opt_.timeout;
    run("scatter", [&] { return backend_->scatter(o, in, opts); });
  }
  //! Returns when every rank has called it.
  virtual void barrier() {
    c10d::BarrierOptions o;
    o.timeout = opt_.timeout;
    run("barrier", [&] { return backend_->barrier(o); });
  }

 protected:
  template <class Start>
  void run(const char* op, Start&& start) {
    const auto n = ++seq_;
    try {
      auto work = start();
      if (!work->wait(opt_.timeout)) throw std::runtime_error("timed out");
    } catch (const std::exception& e) {
      fail(op, n, e.what());
    }
  }
  //! Throws the CommunicationError for collective `n` (`op`), with the census of the other ranks.
  [[noreturn]] void fail(const char* op, std::uint64_t n, std::string msg) const {
    if (const auto cut = msg.find('\n'); cut != std::string::npos) msg.resize(cut);  // drop c10's backtraces
    throw CommunicationError("accel: rank " + std::to_string(rank_) + ": " + op + " (collective #" + std::to_string(n) +
                             ", timeout " + std::to_string(opt_.timeout.count()) + " ms) failed: " + msg + ". " +
                             rdzv_->census() + ".");
  }
  std::uint64_t next_sequence() noexcept { return ++seq_; }
  void check_root(int root, const char* op) const {
    detail::require(root >= 0 && root < size_, "accel: " + std::string(op) + " from rank " + std::to_string(root) +
                                                   ", but the job has ranks 0.." + std::to_string(size_ - 1));
  }

 private:
  std::unique_ptr<Rendezvous> rdzv_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_, size_;
  CommOptions opt_;
  std::uint64_t seq_ = 0;
};

}  // namespace comm
}  // namespace accel
