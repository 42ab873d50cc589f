#pragma once
//! \file
//! Preemption: a cluster asks a job to stop (SIGTERM before a kill; SLURM's `--signal=USR1@<seconds>` before a
//! requeue). With `Options::preemption.enabled`, the signal only raises a flag here; at the next step boundary
//! (a prepared loader asked for its next batch after an optimizer step: gradients synchronised, nothing in
//! flight), every process learns whether any process was signalled, and if so all of them save a checkpoint
//! together (`save_state()`, under the project's automatic naming), then stop: exit with
//! `PreemptionOptions::exit_code`, or throw `accel::Preempted` for a caller that cleans up itself. Restarted, the
//! job resumes with `load_state()` (the latest complete checkpoint) and ends exactly as an uninterrupted run.
//!
//! One agreement per `check_every` optimizer steps (a one-element all-reduce) is what the option costs; off,
//! nothing runs. A signal is acted on within `check_every` steps of its arrival.

#include <accel/error.hpp>

#include <csignal>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace accel {

//! What a job does when it is asked to stop.
struct PreemptionOptions {
  bool enabled = false;                        //!< watch `signals`; save at the next step boundary, then stop
  std::vector<int> signals{SIGTERM, SIGUSR1};  //!< the signals that ask for it
  bool exit = true;                            //!< after saving: exit the process (false: throw `accel::Preempted`)
  int exit_code = 0;                           //!< the exit status then
  int check_every = 1;                         //!< optimizer steps between two agreements (each one all-reduce)
};

//! Thrown (with `PreemptionOptions::exit = false`) on every process once the checkpoint is saved.
struct Preempted : Error {
  //! The signal received and where the checkpoint was saved.
  Preempted(int signal, std::filesystem::path checkpoint)
      : Error("accel: preempted by signal " + std::to_string(signal) + "; checkpoint saved to " + checkpoint.string() +
              " (resume with load_state())"),
        signal_(signal),
        checkpoint_(std::move(checkpoint)) {}
  //! The signal that preempted the job (SIGTERM, SIGUSR1).
  [[nodiscard]] int signal() const noexcept { return signal_; }
  //! The checkpoint saved before stopping.
  [[nodiscard]] const std::filesystem::path& checkpoint() const noexcept { return checkpoint_; }

 private:
  int signal_;
  std::filesystem::path checkpoint_;
};

namespace detail {

//! The last watched signal received (0: none). A signal handler may only store to a `volatile sig_atomic_t`.
inline volatile std::sig_atomic_t preemption_signal = 0;
inline void on_preemption_signal(int sig) { preemption_signal = sig; }

//! Watches signals while it lives (their previous handlers are restored afterwards).
class SignalWatch {
 public:
  SignalWatch() = default;
  explicit SignalWatch(const std::vector<int>& signals) {
    for (int sig : signals) {
      accel::detail::require(sig > 0 && sig < NSIG && sig != SIGKILL && sig != SIGSTOP,
                             "accel: PreemptionOptions::signals holds " + std::to_string(sig) +
                                 ", which cannot be caught; use SIGTERM, SIGUSR1, SIGUSR2 or SIGINT");
      struct sigaction sa {
      }, old{};
      sa.sa_handler = on_preemption_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;  // a collective's system calls go on
      if (::sigaction(sig, &sa, &old) == 0) previous_.emplace_back(sig, old);
    }
  }
  SignalWatch(SignalWatch&& o) noexcept : previous_(std::exchange(o.previous_, {})) {}
  SignalWatch& operator=(SignalWatch&& o) noexcept {
    std::swap(previous_, o.previous_);
    return *this;
  }
  ~SignalWatch() {
    for (auto& [sig, old] : previous_) ::sigaction(sig, &old, nullptr);
  }
  [[nodiscard]] bool active() const noexcept { return !previous_.empty(); }
  //! The signal received since the watch began or the last `clear` (0: none).
  [[nodiscard]] static int received() noexcept { return preemption_signal; }
  static void clear() noexcept { preemption_signal = 0; }

 private:
  std::vector<std::pair<int, struct sigaction>> previous_;
};

}  // namespace detail
}  // namespace accel
