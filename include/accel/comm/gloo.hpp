#pragma once
//! \file
//! The CPU engine: `GlooCommunicator`, the collectives over c10d `ProcessGroupGloo` and accel's rendezvous store
//! (what `torchrun` + Accelerate use for MULTI_CPU). Kept apart because `ProcessGroupGloo.hpp` costs ~10 s per
//! translation unit; only `state/engine.hpp` includes it.

#include <accel/comm/communicator.hpp>
#include <accel/comm/rendezvous.hpp>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::comm {

//! The collectives of `Communicator` on a c10d backend (Gloo), every one waited for with the timeout.
class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::unique_ptr<Rendezvous> rdzv, c10::intrusive_ptr<c10d::Backend> backend, int rank, int size,
                   CommOptions opt)
      : Communicator(rank, size, opt), rdzv_(std::move(rdzv)), backend_(std::move(backend)) {}

  //! The c10d process group (for raw calls beside accel's, e.g. a benchmark's baseline).
  [[nodiscard]] const c10::intrusive_ptr<c10d::Backend>& backend() const noexcept { return backend_; }
  [[nodiscard]] const Rendezvous& rendezvous() const noexcept { return *rdzv_; }

  Pending all_reduce_start(at::Tensor& t) override {
    const auto n = next_sequence();
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.timeout = options().timeout;
    try {
      return {n, std::make_shared<c10::intrusive_ptr<c10d::Work>>(backend_->allreduce(v, o))};
    } catch (const std::exception& e) {
      fail("all_reduce", n, e.what());
    }
  }
  void finish(Pending& p) override {
    if (!p.native) return;
    auto work = std::static_pointer_cast<c10::intrusive_ptr<c10d::Work>>(std::move(p.native));
    try {
      if (!(*work)->wait(options().timeout)) throw std::runtime_error("timed out");
    } catch (const std::exception& e) {
      fail("all_reduce", p.sequence, e.what());
    }
  }
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::sum) override {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = op == ReduceOp::sum ? c10d::ReduceOp::SUM : op == ReduceOp::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::MIN;
    o.timeout = options().timeout;
    run("all_reduce", [&] { return backend_->allreduce(v, o); });
  }
  void broadcast(at::Tensor& t, int root = 0) override {
    check_root(root, "broadcast");
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = options().timeout;
    run("broadcast", [&] { return backend_->broadcast(v, o); });
  }
  std::vector<at::Tensor> all_gather(const at::Tensor& t) override {
    std::vector<at::Tensor> in{t.contiguous()};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size(); ++r) out[0].push_back(at::empty_like(in[0]));
    c10d::AllgatherOptions o;
    o.timeout = options().timeout;
    run("all_gather", [&] { return backend_->allgather(out, in, o); });
    return std::move(out[0]);
  }
  void scatter(at::Tensor& out, const std::vector<at::Tensor>& chunks, int root = 0) override {
    check_root(root, "scatter");
    std::vector<at::Tensor> o{out};
    std::vector<std::vector<at::Tensor>> in;
    if (rank() == root) in.push_back(chunks);
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    opts.timeout = options().timeout;
    run("scatter", [&] { return backend_->scatter(o, in, opts); });
  }
  void barrier() override {
    c10d::BarrierOptions o;
    o.timeout = options().timeout;
    run("barrier", [&] { return backend_->barrier(o); });
  }

 protected:
  [[nodiscard]] std::string census() const noexcept override { return rdzv_->census(); }

 private:
  template <class Start>
  void run(const char* op, Start&& start) {
    const auto n = next_sequence();
    try {
      auto work = start();
      if (!work->wait(options().timeout)) throw std::runtime_error("timed out");
    } catch (const std::exception& e) {
      fail(op, n, e.what());
    }
  }

  std::unique_ptr<Rendezvous> rdzv_;
  c10::intrusive_ptr<c10d::Backend> backend_;
};

//! Rendezvous at the launcher's address and connect its processes with Gloo. The network interface is
//! `GLOO_SOCKET_IFNAME` when set (as in PyTorch), else the address that reaches `addr` (loopback jobs stay
//! on 127.0.0.1).
inline std::unique_ptr<Communicator> make_gloo_communicator(const RendezvousSpec& spec, const CommOptions& opt) {
  const std::string& addr = spec.addr;
  const int rank = spec.rank, size = spec.size;
  auto rdzv = std::make_unique<Rendezvous>(spec, opt);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = opt.timeout;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (addr == "127.0.0.1" || addr == "localhost" || addr == "::1")
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(addr));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    auto store = c10::make_intrusive<c10d::PrefixStore>("accel/gloo", rdzv->store());
    backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (const auto cut = msg.find('\n'); cut != std::string::npos) msg.resize(cut);
    throw CommunicationError("accel: rank " + std::to_string(rank) + ": connecting " + std::to_string(size) +
                             " processes with Gloo failed: " + msg + ". " + rdzv->census() + ".");
  }
  return std::make_unique<GlooCommunicator>(std::move(rdzv), std::move(backend), rank, size, opt);
}

}  // namespace accel::comm
