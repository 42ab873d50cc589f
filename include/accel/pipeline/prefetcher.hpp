#pragma once
//! \file
//! `Prefetcher`: items 0, 1, 2, ... produced by `workers` threads, handed out in order. `produce(j)` returns item
//! j, or nothing when there is no item j (a stream that ended: the consumer then gets nothing, and no later item
//! is asked for). `count` bounds the items when it is known (`unknown_count` otherwise). At most `depth * workers`
//! items are prepared ahead of the consumer (a bounded queue); an exception thrown while preparing item j reaches
//! the consumer when it asks for item j, with its original message; destroying the prefetcher in the middle of an
//! epoch stops the workers and joins them. With `workers == 0` items are prepared on the consumer's thread, when
//! asked for.
//!
//! `InOrder` serialises the part of a producer that must run in item order (reading a stream), so that the rest
//! (collating, placing) still runs in parallel.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace accel::pipeline::detail {

inline constexpr std::int64_t unknown_count = std::numeric_limits<std::int64_t>::max();

template <class Item>
class Prefetcher {
 public:
  using Produce = std::function<std::optional<Item>(std::int64_t)>;

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

  //! The next item, waiting for it if needed; nothing at the end. Rethrows what preparing it threw.
  std::optional<Item> next() {
    if (consumed_ >= count_) return std::nullopt;
    const std::int64_t j = consumed_++;
    if (threads_.empty()) {
      auto item = produce_(j);
      if (!item) count_ = j;
      return item;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.notify_all();  // the window moved: workers may take more
    cv_.wait(lock, [&] { return done_.count(j) > 0; });
    auto slot = std::move(done_.at(j));
    done_.erase(j);
    if (!slot.item && !slot.error) count_ = j;
    cv_.notify_all();
    lock.unlock();
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(slot.item);
  }

 private:
  struct Slot {
    std::optional<Item> item;
    std::exception_ptr error;
  };
  void work() {
    for (;;) {
      std::int64_t j;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return stop_ || (issued_ < std::min<std::int64_t>(count_.load(), end_) && issued_ < consumed_ + depth_);
        });
        if (stop_) return;
        j = issued_++;
      }
      Slot slot;
      try {
        slot.item = produce_(j);
      } catch (...) {
        slot.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!slot.item && !slot.error) end_ = std::min(end_, j + 1);  // nothing after the end is asked for
        done_.emplace(j, std::move(slot));
      }
      cv_.notify_all();
    }
  }

  std::atomic<std::int64_t> count_;
  const std::int64_t depth_;
  Produce produce_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::int64_t, Slot> done_;
  std::int64_t issued_ = 0;
  std::int64_t end_ = unknown_count;  // one past the first item that was not there
  std::atomic<std::int64_t> consumed_{0};
  bool stop_ = false;
};

//! Runs `f` for item j only after it ran for every item before j (whichever worker holds them), so that a
//! sequential source is read in item order. An exception from `f` still lets the next item through.
class InOrder {
 public:
  template <class F>
  auto run(std::int64_t j, F&& f) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return turn_ == j; });
    struct Next {
      InOrder& o;
      ~Next() {
        ++o.turn_;
        o.cv_.notify_all();
      }
    } next{*this};
    return f();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::int64_t turn_ = 0;
};

}  // namespace accel::pipeline::detail
