#pragma once
//! \file
//! `Rendezvous`: where the processes of a job meet. A c10d `TCPStore` hosted by rank 0, every rank announcing
//! itself (a missing rank is named), and a heartbeat per process with a census that names the ranks that stopped
//! (Note [Dead peers] in communicator.hpp). The engines (Gloo, NCCL) exchange their addresses through its store.

#include <accel/comm/communicator.hpp>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace accel::comm {

//! Where the processes of a job meet: the store's address (rank 0 hosts it unless `host_store` is false), this
//! process's rank and the number of processes.
struct RendezvousSpec {
  std::string addr = "127.0.0.1";
  int port = 29500;
  int rank = 0;
  int size = 1;
  bool host_store = true;  //!< rank 0 starts the store (false: torchrun's agent already hosts it)
};

//! The rendezvous: a TCPStore hosted by rank 0, every rank announcing itself, and a census of heartbeats.
class Rendezvous {
 public:
  Rendezvous(const RendezvousSpec& spec, const CommOptions& opt)
      : addr_(spec.addr), port_(spec.port), rank_(spec.rank), size_(spec.size), opt_(opt) {
    const int rank = rank_, size = size_;
    const auto t0 = Clock::now();
    try {
      store_ = connect(opt.rendezvous_timeout, rank == 0 && spec.host_store);
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

}  // namespace accel::comm
