// The loader's worker machinery under ThreadSanitizer (built with -fsanitize=thread; it needs no LibTorch, whose
// libraries are not instrumented): ordered results, bounded look-ahead, errors forwarded, abandonment joins.
#include <accel/pipeline/prefetcher.hpp>

#include <atomic>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

int main() {
  int failed = 0, passed = 0;
  auto check = [&](bool ok, const char* what) {
    ok ? ++passed : ++failed;
    if (!ok) std::printf("FAILED: %s\n", what);
  };
  for (int workers : {1, 2, 4}) {
    for (int depth : {1, 3}) {
      std::atomic<std::int64_t> most_ahead{0}, consumed{0};
      {
        accel::pipeline::detail::Prefetcher<std::int64_t> p(200, workers, depth, [&](std::int64_t j) {
          most_ahead = std::max<std::int64_t>(most_ahead, j - consumed);
          return j * j;
        });
        bool ordered = true;
        for (std::int64_t j = 0; j < 200; ++j) {
          ordered &= p.next() == j * j;
          consumed = j + 1;
        }
        check(ordered, "results come in order");
        check(most_ahead <= std::int64_t(depth) * workers + 1, "look-ahead stays bounded");
      }
      {
        accel::pipeline::detail::Prefetcher<int> p(50, workers, depth, [](std::int64_t j) -> int {
          if (j == 7) throw std::runtime_error("batch 7 is broken");
          return int(j);
        });
        std::string message;
        try {
          for (int j = 0; j < 50; ++j) (void)p.next();
        } catch (const std::runtime_error& e) {
          message = e.what();
        }
        check(message == "batch 7 is broken", "an error reaches the consumer with its message");
      }
      {  // a stream: unknown length, read in order (InOrder) while the rest of each item runs in parallel
        accel::pipeline::detail::InOrder order;
        std::int64_t cursor = 0;  // the stream's position: only touched in item order
        accel::pipeline::detail::Prefetcher<std::int64_t> p(
            accel::pipeline::detail::unknown_count, workers, depth, [&](std::int64_t j) -> std::optional<std::int64_t> {
              const auto read = order.run(j, [&]() -> std::optional<std::int64_t> {
                if (cursor == 100) return std::nullopt;
                return cursor++;
              });
              if (!read) return std::nullopt;
              return *read * 2;
            });
        bool ordered = true;
        std::int64_t seen = 0;
        while (auto x = p.next()) ordered &= *x == 2 * seen++;
        check(ordered && seen == 100, "a stream of unknown length comes whole and in order");
        check(!p.next(), "nothing after the end of a stream");
      }
      {  // abandoned after 3 batches with work in flight: the destructor joins
        accel::pipeline::detail::Prefetcher<int> p(1000, workers, depth, [](std::int64_t j) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          return int(j);
        });
        for (int j = 0; j < 3; ++j) (void)p.next();
      }
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
