#pragma once
//! \file
//! `DistributedModule`: the user's `torch::nn::Module` with gradients averaged across processes (what PyTorch's
//! DistributedDataParallel does, whose reducer LibTorch does not expose).
//!
//! - At construction, rank 0's parameters and buffers are broadcast, so every process starts equal.
//! - Parameters are grouped into buckets of about `bucket_bytes` (25 MiB by default), in reverse registration
//!   order (roughly the order backward produces their gradients).
//! - During backward, a hook after each parameter's gradient accumulation marks it ready; when a bucket is
//!   complete (and all buckets before it have started: every rank issues the same collectives in the same
//!   order), its gradients are flattened and an asynchronous all-reduce starts, overlapping the rest of backward.
//! - At the end of backward (an autograd engine callback) every bucket is waited for, divided by N and copied
//!   back into the gradients.
//! - `no_sync()` (RAII) keeps gradients local: they accumulate until a step with sync.
//! - A parameter that received no gradient in a synchronising backward is an error naming it, unless
//!   `find_unused_parameters` (then it contributes zeros, as in DDP).

#include <accel/comm/collectives.hpp>
#include <accel/comm/communicator.hpp>
#include <accel/error.hpp>

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace accel {

struct DistributedOptions {
  std::int64_t bucket_bytes = 25 * 1024 * 1024;
  bool find_unused_parameters = false;
};

class DistributedModule {
  struct Param {
    std::string name;
    at::Tensor tensor;
    std::size_t bucket = 0;
    bool ready = false;
  };
  struct Bucket {
    std::vector<std::size_t> params;
    std::size_t ready = 0;
    at::Tensor flat;
    comm::Communicator::Pending pending;
    bool launched = false;
  };
  struct State {
    comm::Communicator* comm = nullptr;
    DistributedOptions opt;
    std::vector<Param> params;
    std::vector<Bucket> buckets;
    std::size_t next_launch = 0;
    bool sync = true;
    bool callback_queued = false;
    std::mutex mu;
  };

  struct Hook final : torch::autograd::PostAccumulateGradHook {
    Hook(std::shared_ptr<State> s, std::size_t i) : state(std::move(s)), index(i) {}
    void operator()(const torch::autograd::Variable&) override { DistributedModule::ready(state, index); }
    std::shared_ptr<State> state;
    std::size_t index;
  };

 public:
  DistributedModule(std::shared_ptr<torch::nn::Module> module, comm::Communicator* comm, DistributedOptions opt = {})
      : module_(std::move(module)), state_(std::make_shared<State>()) {
    auto& s = *state_;
    s.comm = comm;
    s.opt = opt;
    {
      torch::NoGradGuard no_grad;
      for (auto& p : module_->named_parameters()) {
        at::Tensor t = p.value();
        broadcast(comm, t, 0);  // every process starts from rank 0's weights
      }
      for (auto& b : module_->named_buffers()) {
        at::Tensor t = b.value();
        broadcast(comm, t, 0);
      }
    }
    for (auto& p : module_->named_parameters())
      if (p.value().requires_grad()) s.params.push_back({p.key(), p.value()});
    // Buckets in reverse registration order.
    std::int64_t bytes = 0;
    for (std::size_t k = s.params.size(); k-- > 0;) {
      const auto& t = s.params[k].tensor;
      const std::int64_t b = t.numel() * std::int64_t(t.element_size());
      if (s.buckets.empty() || bytes + b > opt.bucket_bytes) s.buckets.emplace_back(), bytes = 0;
      s.params[k].bucket = s.buckets.size() - 1;
      s.buckets.back().params.push_back(k);
      bytes += b;
    }
    if (comm && comm->size() > 1)
      for (std::size_t k = 0; k < s.params.size(); ++k)
        torch::autograd::impl::set_post_acc_grad_hooks(s.params[k].tensor, std::make_unique<Hook>(state_, k));
  }
  ~DistributedModule() {
    for (auto& p : state_->params) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  }
  DistributedModule(const DistributedModule&) = delete;
  DistributedModule& operator=(const DistributedModule&) = delete;

  //! The user's module (for forward, state_dict, ...).
  [[nodiscard]] torch::nn::Module& module() noexcept { return *module_; }
  [[nodiscard]] const std::shared_ptr<torch::nn::Module>& shared() const noexcept { return module_; }
  [[nodiscard]] std::size_t buckets() const noexcept { return state_->buckets.size(); }

  //! RAII: gradients stay local while it lives (accumulation steps).
  class NoSync {
   public:
    explicit NoSync(State& s) : s_(&s), previous_(s.sync) { s.sync = false; }
    ~NoSync() { s_->sync = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    State* s_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*state_); }
  //! Whether the next backward averages gradients.
  void set_sync(bool sync) { state_->sync = sync; }
  [[nodiscard]] bool sync() const noexcept { return state_->sync; }

 private:
  static void ready(const std::shared_ptr<State>& sp, std::size_t index) {
    auto& s = *sp;
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.sync) return;
    if (!s.callback_queued) {
      s.callback_queued = true;
      std::weak_ptr<State> weak = sp;
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto st = weak.lock()) finalize(*st);
      });
    }
    auto& p = s.params[index];
    if (p.ready) return;  // a parameter used twice in the graph fires once per accumulation
    p.ready = true;
    ++s.buckets[p.bucket].ready;
    launch_ready(s);
  }
  // Starts every complete bucket, in index order only.
  static void launch_ready(State& s) {
    while (s.next_launch < s.buckets.size() && s.buckets[s.next_launch].ready == s.buckets[s.next_launch].params.size()) {
      launch(s, s.buckets[s.next_launch]);
      ++s.next_launch;
    }
  }
  static void launch(State& s, Bucket& b) {
    std::vector<at::Tensor> grads;
    for (auto k : b.params) {
      const auto& t = s.params[k].tensor;
      grads.push_back(t.grad().defined() ? t.grad().reshape({-1}) : at::zeros({t.numel()}, t.options()));
    }
    b.flat = at::cat(grads, 0);
    b.pending = s.comm->all_reduce_start(b.flat);
    b.launched = true;
  }
  static void finalize(State& s) {
    std::lock_guard<std::mutex> lock(s.mu);
    std::string unused;
    for (auto& p : s.params)
      if (!p.ready) unused += (unused.empty() ? "" : ", ") + p.name;
    if (!unused.empty() && !s.opt.find_unused_parameters) {
      reset(s);
      throw InvalidArgument("accel::DistributedModule: parameter(s) " + unused + " received no gradient in this backward; "
                            "every process must use every parameter, or set DistributedOptions::find_unused_parameters");
    }
    for (auto& p : s.params)  // unused parameters contribute zeros
      if (!p.ready) p.ready = true, ++s.buckets[p.bucket].ready;
    launch_ready(s);
    const double n = double(s.comm->size());
    for (auto& b : s.buckets) {
      s.comm->finish(b.pending);
      b.flat.div_(n);
      std::int64_t offset = 0;
      for (auto k : b.params) {
        auto& t = s.params[k].tensor;
        const auto count = t.numel();
        auto avg = b.flat.narrow(0, offset, count).view(t.sizes());
        if (t.grad().defined()) t.mutable_grad().copy_(avg);
        else t.mutable_grad() = avg.clone();
        offset += count;
      }
    }
    reset(s);
  }
  static void reset(State& s) {
    for (auto& p : s.params) p.ready = false;
    for (auto& b : s.buckets) b.ready = 0, b.launched = false, b.flat = at::Tensor();
    s.next_launch = 0;
    s.callback_queued = false;
  }

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<State> state_;
};

}  // namespace accel
