#pragma once
//! \file
//! `Prefetcher`: batches 0..count-1 produced by `workers` threads, handed out in order. At most `depth`
//! batches are prepared ahead of the consumer (a bounded queue); an exception thrown while preparing batch j
//! reaches the consumer when it asks for batch j, with its original message; destroying the prefetcher in
//! the middle of an epoch stops the workers and joins them. With `workers == 0` batches are prepared on the
//! consumer's thread, when asked for.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace accel::data::detail {

template <class Batch>
class Prefetcher {
 public:
  using Produce = std::function<Batch(std::int64_t)>;

  Prefetcher(std::int64_t count, int workers, int depth, Produce produce)
      : count_(count), depth_(std::max(depth, 1) * std::max(workers, 1)), produce_(std::move(produce)) {
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  //! Batch `consumed` (the next one), waiting for it if needed; rethrows what preparing it threw.
  Batch next() {
    const std::int64_t j = consumed_++;
    if (threads_.empty()) return produce_(j);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.notify_all();  // the window moved: workers may take more
    cv_.wait(lock, [&] { return done_.count(j) > 0; });
    auto slot = std::move(done_.at(j));
    done_.erase(j);
    cv_.notify_all();
    lock.unlock();
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(*slot.batch);
  }

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  void work() {
    for (;;) {
      std::int64_t j;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (issued_ < count_ && issued_ < consumed_ + depth_); });
        if (stop_) return;
        j = issued_++;
      }
      Slot slot;
      try {
        slot.batch.emplace(produce_(j));
      } catch (...) {
        slot.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(j, std::move(slot));
      }
      cv_.notify_all();
    }
  }

  const std::int64_t count_;
  const std::int64_t depth_;
  Produce produce_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::int64_t, Slot> done_;
  std::int64_t issued_ = 0;
  std::atomic<std::int64_t> consumed_{0};
  bool stop_ = false;
};

}  // namespace accel::data::detail
