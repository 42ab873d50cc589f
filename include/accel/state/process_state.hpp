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
#include <accel/error.hpp>
#include <accel/state/engine.hpp>
#include <accel/state/launch_env.hpp>

#include <ATen/ops/cat.h>
#include <c10/core/Device.h>

#include <concepts>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel {

namespace detail {
template <class R>
struct on_process_result {
  using type = std::optional<std::decay_t<R>>;
};
template <>
struct on_process_result<void> {
  using type = bool;
};
}  // namespace detail
//! What `ProcessState::on_main_process` and the other `on_*` helpers return for the callable `F`: `bool`
//! (whether it ran) when `F` returns nothing, else `std::optional` of its decayed result (empty where it did not run).
template <class F>
using OnProcessResult = typename detail::on_process_result<std::invoke_result_t<F>>::type;

//! Which process this is, its device and its communicator (Accelerate's `PartialState`): ranks, barriers,
//! `main_process_first`, `split_between_processes`, `print`, `on_main_process` and its kin. One per process: the first
//! construction connects, later ones share it.
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
      // After the connection: its libraries (OpenSSL, c10d, Gloo) registered their exit handlers first, so this
      // one runs before them (Note [Exit] in state/rendezvous/rendezvous.hpp).
      static const bool registered = std::atexit(&ProcessState::release_at_exit) == 0;
      (void)registered;
    }
    s_ = global;
  }

  //! Tears down the process's state (communicator included) so that the next construction starts anew.
  //! For tests; handles made before keep the old state alive until they go.
  static void reset() {
    std::lock_guard<std::mutex> lock(mutex());
    instance().reset();
  }
  //! Whether a `ProcessState` exists in this process (a first construction has connected it).
  static bool initialized() {
    std::lock_guard<std::mutex> lock(mutex());
    return instance() != nullptr;
  }

  //! The number of processes of the job (`WORLD_SIZE`).
  [[nodiscard]] int num_processes() const noexcept { return s_->env.world_size; }
  //! This process's rank (`RANK`).
  [[nodiscard]] int process_index() const noexcept { return s_->env.rank; }
  //! This process's index on its node (`LOCAL_RANK`).
  [[nodiscard]] int local_process_index() const noexcept { return s_->env.local_rank; }
  //! The number of processes on this node (`LOCAL_WORLD_SIZE`).
  [[nodiscard]] int local_num_processes() const noexcept { return s_->env.local_world_size; }
  //! The kind of job (Accelerate's `distributed_type`: NO, MULTI_CPU, MULTI_GPU).
  [[nodiscard]] DistributedType distributed_type() const noexcept { return s_->conn.type; }
  //! This process's device: its GPU under NCCL (or one process on a GPU machine), else the CPU.
  [[nodiscard]] const c10::Device& device() const noexcept { return s_->conn.device; }
  //! The launch environment as read at the first construction.
  [[nodiscard]] const LaunchEnv& launch_env() const noexcept { return s_->env; }
  //! 0 on the job's first attempt; after the launcher restarted every process (accel-launch --max-restarts, torchrun),
  //! the restart's number (`TORCHELASTIC_RESTART_COUNT`): a restarted program resumes from its latest checkpoint.
  [[nodiscard]] int restart_count() const noexcept { return s_->env.restart_count; }
  //! Whether several processes are connected (Accelerate's `use_distributed`).
  [[nodiscard]] bool use_distributed() const noexcept {
    return s_->conn.type != DistributedType::no && num_processes() > 1;
  }
  //! Whether this is rank 0.
  [[nodiscard]] bool is_main_process() const noexcept { return process_index() == 0; }
  //! Whether this is the first process of its node.
  [[nodiscard]] bool is_local_main_process() const noexcept { return local_process_index() == 0; }
  //! Whether this is the last rank.
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
    //! `is_first`: this process runs first (it waits at the guard's end); the others wait at its start.
    FirstGuard(const ProcessState& s, bool is_first) : s_(s), first_(is_first) {
      if (!first_) s_.wait_for_everyone();
    }
    ~FirstGuard() noexcept(false) {
      if (!first_) return;
      if (std::uncaught_exceptions() > 0) {
        try {
          s_.wait_for_everyone();
        } catch (...) {
        }  // already unwinding: do not replace that error
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
  //! Accelerate's `main_process_first`: the main process runs the guard's scope first, then the others.
  [[nodiscard]] FirstGuard main_process_first() const { return {*this, is_main_process()}; }
  //! Accelerate's `local_main_process_first`: each node's first process runs first, then that node's others.
  [[nodiscard]] FirstGuard local_main_process_first() const { return {*this, is_local_main_process()}; }

  // [accelerate:state.py PartialState.on_main_process]
  //! Runs `f()` on the main process only (Accelerate's decorators, as calls). On the other processes `f` is
  //! not called. The result says what happened: for an `f` that returns nothing, whether it ran (`bool`); else
  //! its result where it ran and `std::nullopt` elsewhere (`std::optional` of the decayed result: a copy when
  //! `f` returns a reference). None of these helpers communicates.
  template <std::invocable F>
  OnProcessResult<F> on_main_process(F&& f) const {
    return run_if(is_main_process(), std::forward<F>(f));
  }
  // [accelerate:state.py PartialState.on_local_main_process]
  //! Runs `f()` on the main process of each node only (see `on_main_process` for the result).
  template <std::invocable F>
  OnProcessResult<F> on_local_main_process(F&& f) const {
    return run_if(is_local_main_process(), std::forward<F>(f));
  }
  // [accelerate:state.py PartialState.on_last_process]
  //! Runs `f()` on the last process (`num_processes() - 1`) only (see `on_main_process` for the result).
  template <std::invocable F>
  OnProcessResult<F> on_last_process(F&& f) const {
    return run_if(is_last_process(), std::forward<F>(f));
  }
  // [accelerate:state.py PartialState.on_process]
  //! Runs `f()` on the process `index` only (see `on_main_process` for the result). An index outside
  //! `[0, num_processes())` is an error on every process.
  template <std::invocable F>
  OnProcessResult<F> on_process(int index, F&& f) const {
    check_index("on_process", "process", "job", index, num_processes(), "num_processes()");
    return run_if(process_index() == index, std::forward<F>(f));
  }
  // [accelerate:state.py PartialState.on_local_process]
  //! Runs `f()` on the process whose local index (on its node) is `local_index`, on every node (see
  //! `on_main_process` for the result). An index outside `[0, local_num_processes())` is an error.
  template <std::invocable F>
  OnProcessResult<F> on_local_process(int local_index, F&& f) const {
    check_index("on_local_process", "local process", "node", local_index, local_num_processes(),
                "local_num_processes()");
    return run_if(local_process_index() == local_index, std::forward<F>(f));
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
  //! A tensor's contiguous share along dim 0 (padded with its last row to the largest share when `apply_padding`).
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
  //! Each list of a map split alike (every list of one length), the keys kept.
  template <class K, class V>
  std::map<K, std::vector<V>> split_between_processes(const std::map<K, std::vector<V>>& inputs,
                                                      bool apply_padding = false) const {
    std::map<K, std::vector<V>> out;
    std::size_t length = inputs.empty() ? 0 : inputs.begin()->second.size();
    for (const auto& [k, v] : inputs) {
      detail::require(v.size() == length,
                      "accel::split_between_processes: all values of the map must have the same length");
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

  template <class F>
  static OnProcessResult<F> run_if(bool run, F&& f) {
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
      if (run) std::invoke(std::forward<F>(f));
      return run;
    } else {
      if (!run) return std::nullopt;
      return OnProcessResult<F>(std::invoke(std::forward<F>(f)));
    }
  }
  static void check_index(const char* helper, const char* what, const char* where, int index, int count,
                          const char* bound) {
    if (index >= 0 && index < count) return;
    throw InvalidArgument(std::string("accel::") + helper + ": " + what + " index " + std::to_string(index) +
                          " is out of range: this " + where + " has " + std::to_string(count) + " " + what +
                          (count == 1 ? "" : "es") + ", so the valid indices are 0 to " + std::to_string(count - 1) +
                          "; pass an index below " + bound);
  }

  // The process is exiting (Note [Exit]): the process state goes now, while every library it uses is whole; a
  // handle still held elsewhere keeps it until that handle goes (its heartbeat is stopped by the rendezvous' handler).
  static void release_at_exit() noexcept {
    std::shared_ptr<Shared> s;
    {
      std::lock_guard<std::mutex> lock(mutex());
      s = std::move(instance());
    }
    s.reset();
  }
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
