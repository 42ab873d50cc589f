#pragma once
//! \file
//! `ProcessState`: which process this is, on which device, and the communicator that connects it to the
//! others. Accelerate's `PartialState`: one per process, shared by every `Accelerator`; the first
//! construction wins and later ones reuse it (their options are ignored, as in Accelerate).
//!
//! \code
//! accel::ProcessState state;                           // reads accel-launch / torchrun / mpirun / srun
//! if (state.is_main_process()) ...;
//! { auto first = state.main_process_first(); download(); }   // main first, then the others
//! auto mine = state.split_between_processes(prompts);   // contiguous share, first ranks get one more
//! state.print("loss ", loss);                           // local main process only
//! \endcode
//!
//! The engine is the `dist` tag given to the first construction (`ProcessState(opt, accel::dist::gloo{})`;
//! `dist::from_env` by default), chosen at compile time (state/engine.hpp): one process is `none`; several use
//! NCCL when the process sees a GPU and accel was built with CUDA, else Gloo. Several processes without a GPU
//! therefore get the CPU engine with no flag (Accelerate needs `cpu=True`, Q19). Like Accelerate, when
//! `OMP_NUM_THREADS` is not set, the CPU processes of a node share its cores (intra-op threads = cores / local
//! processes) instead of each taking all of them.

#include <accel/comm/communicator.hpp>
#include <accel/state/engine.hpp>
#include <accel/state/launch_env.hpp>

#include <ATen/ops/cat.h>
#include <c10/core/Device.h>

#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace accel {

class ProcessState {
  struct Shared {
    LaunchEnv env;
    Connection conn;
  };

 public:
  //! Joins the job with the engine of `Dist` (the first construction in a process; later ones share it).
  template <class Dist = dist::from_env>
  explicit ProcessState(ProcessOptions opt = {}, Dist = {}) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& global = instance();
    if (!global) {
      auto s = std::make_shared<Shared>();
      s->env = detect_launch_env(opt.env, opt.launch);
      s->conn = Engine<Dist>::connect(s->env, opt);
      global = std::move(s);
    }
    s_ = global;
  }

  //! Tears down the process's state (communicator included) so that the next construction starts anew.
  //! For tests; handles made before keep the old state alive until they go.
  static void reset() {
    std::lock_guard<std::mutex> lock(mutex());
    instance().reset();
  }
  static bool initialized() {
    std::lock_guard<std::mutex> lock(mutex());
    return instance() != nullptr;
  }

  [[nodiscard]] int num_processes() const noexcept { return s_->env.world_size; }
  [[nodiscard]] int process_index() const noexcept { return s_->env.rank; }
  [[nodiscard]] int local_process_index() const noexcept { return s_->env.local_rank; }
  [[nodiscard]] int local_num_processes() const noexcept { return s_->env.local_world_size; }
  [[nodiscard]] DistributedType distributed_type() const noexcept { return s_->conn.type; }
  [[nodiscard]] const c10::Device& device() const noexcept { return s_->conn.device; }
  [[nodiscard]] const LaunchEnv& launch_env() const noexcept { return s_->env; }
  //! 0 on the job's first attempt; after the launcher restarted every process (accel-launch --max-restarts, torchrun),
  //! the restart's number (`TORCHELASTIC_RESTART_COUNT`): a restarted program resumes from its latest checkpoint.
  [[nodiscard]] int restart_count() const noexcept { return s_->env.restart_count; }
  [[nodiscard]] bool use_distributed() const noexcept { return s_->conn.type != DistributedType::no && num_processes() > 1; }
  [[nodiscard]] bool is_main_process() const noexcept { return process_index() == 0; }
  [[nodiscard]] bool is_local_main_process() const noexcept { return local_process_index() == 0; }
  [[nodiscard]] bool is_last_process() const noexcept { return process_index() == num_processes() - 1; }
  //! The communicator, or nullptr with one process (the collectives accept both).
  [[nodiscard]] comm::Communicator* comm() const noexcept { return s_->conn.comm.get(); }

  //! A barrier over every process (nothing with one process).
  void wait_for_everyone() const {
    if (auto* c = comm()) c->barrier();
  }

  //! RAII: the main process runs the scope first, the others after it (one barrier per process).
  //! Unlike Python, an exception in the main process's scope still releases the others.
  class FirstGuard {
   public:
    FirstGuard(const ProcessState& s, bool is_first) : s_(s), first_(is_first) {
      if (!first_) s_.wait_for_everyone();
    }
    ~FirstGuard() noexcept(false) {
      if (!first_) return;
      if (std::uncaught_exceptions() > 0) {
        try { s_.wait_for_everyone(); } catch (...) {}  // already unwinding: do not replace that error
      } else {
        s_.wait_for_everyone();
      }
    }
    FirstGuard(const FirstGuard&) = delete;
    FirstGuard& operator=(const FirstGuard&) = delete;

   private:
    const ProcessState& s_;
    bool first_;
  };
  [[nodiscard]] FirstGuard main_process_first() const { return {*this, is_main_process()}; }
  [[nodiscard]] FirstGuard local_main_process_first() const { return {*this, is_local_main_process()}; }

  //! Runs `f` on the main process only (returns whether it ran).
  template <class F>
  bool on_main_process(F&& f) const {
    if (!is_main_process()) return false;
    std::forward<F>(f)();
    return true;
  }
  template <class F>
  bool on_local_main_process(F&& f) const {
    if (!is_local_main_process()) return false;
    std::forward<F>(f)();
    return true;
  }
  template <class F>
  bool on_process(int index, F&& f) const {
    if (process_index() != index) return false;
    std::forward<F>(f)();
    return true;
  }

  //! Prints its arguments, space-free, followed by a newline, on the local main process only.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_local_main_process()) return;
    std::ostringstream os;
    (os << ... << args);
    std::cout << os.str() << std::endl;
  }

  // [accelerate:state.py PartialState.split_between_processes]
  //! This process's contiguous share of `inputs` (`std::vector` or a tensor along dim 0, or a `std::map` of
  //! vectors split value by value): `q, e = divmod(len, N)`; rank r gets `[r*q + min(r, e), ... + q + (r < e))`.
  //! With `apply_padding` every share is topped up to `ceil(len/N)` with copies of the last element (for a
  //! tensor, `pad_across_processes`, a collective). The input is never modified. One process gets it all.
  template <class T>
  std::vector<T> split_between_processes(const std::vector<T>& inputs, bool apply_padding = false) const {
    const auto [start, end] = share(int64_t(inputs.size()));
    std::vector<T> out(inputs.begin() + start, inputs.begin() + end);
    if (apply_padding && num_processes() > 1 && !inputs.empty())
      while (int64_t(out.size()) < ceil_share(int64_t(inputs.size()))) out.push_back(inputs.back());
    return out;
  }
  at::Tensor split_between_processes(const at::Tensor& inputs, bool apply_padding = false) const {
    detail::require(inputs.dim() > 0, "accel::split_between_processes: cannot split a 0-dim tensor");
    const auto [start, end] = share(inputs.size(0));
    at::Tensor out = inputs.narrow(0, start, end - start);
    if (!apply_padding || num_processes() == 1 || inputs.size(0) == 0) return out;
    const int64_t target = ceil_share(inputs.size(0));
    if (out.size(0) == target) return out.clone();
    auto shape = inputs.sizes().vec();
    shape[0] = target - out.size(0);
    return at::cat({out, inputs.narrow(0, inputs.size(0) - 1, 1).expand(shape)}, 0);
  }
  template <class K, class V>
  std::map<K, std::vector<V>> split_between_processes(const std::map<K, std::vector<V>>& inputs, bool apply_padding = false) const {
    std::map<K, std::vector<V>> out;
    std::size_t length = inputs.empty() ? 0 : inputs.begin()->second.size();
    for (const auto& [k, v] : inputs) {
      detail::require(v.size() == length, "accel::split_between_processes: all values of the map must have the same length");
      out.emplace(k, split_between_processes(v, apply_padding));
    }
    return out;
  }

 private:
  std::pair<int64_t, int64_t> share(int64_t length) const {
    if (num_processes() == 1) return {0, length};
    const int64_t n = num_processes(), r = process_index();
    const int64_t q = length / n, e = length % n;
    const int64_t start = r * q + std::min(r, e);
    return {start, start + q + (r < e ? 1 : 0)};
  }
  int64_t ceil_share(int64_t length) const { return (length + num_processes() - 1) / num_processes(); }

  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::shared_ptr<Shared>& instance() {
    static std::shared_ptr<Shared> s;
    return s;
  }

  std::shared_ptr<Shared> s_;
};

}  // namespace accel
