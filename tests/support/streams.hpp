#pragma once
// Streams of unknown length, as users write them (data/dataset.hpp, `IterableDataset`): shared by the unit and
// multi-process loader tests. None has a `size()`; each yields the ids 0, 1, 2, ... so that its batches can be
// compared with those of a sized stream (`std::views::all` of a vector) and a map-style dataset. `take` runs a
// loader's loop as a user does, leaving it after k batches.
#include "samples.hpp"

#include <accel/state/gradient_state.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <ranges>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace accel_test {

//! The first `k` batches (every one when k < 0) of a loader's next epoch, and end_of_dataloader after each: the loop
//! leaves once it holds k batches, so the loader has yielded exactly k.
template <class Loader>
std::pair<Batches, std::vector<bool>> take(Loader& loader, std::int64_t k) {
  Batches out;
  std::vector<bool> ends;
  if (k == 0) return {out, ends};
  for (const auto& b : loader) {
    out.push_back(as_vector(b));
    ends.push_back(accel::GradientState::instance().end_of_dataloader());
    if (std::int64_t(out.size()) == k) break;
  }
  return {out, ends};
}

//! Samples made on the fly, `n` of them, by an iterator and a sentinel: no `size()`, nothing stored.
struct Generated {
  std::int64_t n = 0;
  struct iterator {
    using value_type = std::int64_t;
    using difference_type = std::ptrdiff_t;
    std::int64_t i = 0, n = 0;
    std::int64_t operator*() const { return i; }
    iterator& operator++() {
      ++i;
      return *this;
    }
    void operator++(int) { ++i; }
    bool operator==(std::default_sentinel_t) const { return i >= n; }
  };
  [[nodiscard]] iterator begin() const { return {0, n}; }
  [[nodiscard]] std::default_sentinel_t end() const { return {}; }
};

//! A stream that never ends: 0, 1, 2, ... (the loop stops it).
inline auto endless() { return std::views::iota(std::int64_t{0}); }

//! A file reader: one id per line of a text file, read as the loader advances (each pass opens the file anew).
class LinesOfFile {
 public:
  explicit LinesOfFile(std::filesystem::path path) : path_(std::move(path)) {}
  //! Writes 0..n-1, one per line, to `path` and reads it.
  static LinesOfFile written(const std::filesystem::path& path, std::int64_t n) {
    std::ofstream out(path, std::ios::trunc);
    for (std::int64_t i = 0; i < n; ++i) out << i << '\n';
    return LinesOfFile(path);
  }
  struct iterator {
    using value_type = std::int64_t;
    using difference_type = std::ptrdiff_t;
    std::shared_ptr<std::ifstream> in;  // shared: an input iterator's copies read one file
    std::int64_t value = 0;
    bool done = true;
    std::int64_t operator*() const { return value; }
    iterator& operator++() {
      done = !(*in >> value);
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return done; }
  };
  [[nodiscard]] iterator begin() const {
    iterator it{std::make_shared<std::ifstream>(path_)};
    if (!*it.in) throw std::runtime_error("cannot read " + path_.string());
    return ++it;
  }
  [[nodiscard]] std::default_sentinel_t end() const { return {}; }

 private:
  std::filesystem::path path_;
};

}  // namespace accel_test
