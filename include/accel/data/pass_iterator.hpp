#pragma once
//! \file
//! The input iterator of every single-pass range in accel (the streaming shards, the prepared loaders): one pass
//! (a shard's pass over its source, a loader's epoch), shared by the iterator's copies. Each step asks the pass
//! to `advance()`; when it cannot, the pass's `finish()` runs if it has one (a loader's epoch ends there) and the
//! iterator equals the sentinel. The pass holds the element in `current`, as a value or a `std::optional`.

#include <iterator>
#include <memory>
#include <optional>

namespace accel::data::detail {

template <class T>
const T& current_of(const T& v) {
  return v;
}
template <class T>
const T& current_of(const std::optional<T>& v) {
  return *v;
}

template <class Pass, class Value>
class PassIterator {
 public:
  using iterator_concept = std::input_iterator_tag;
  using iterator_category = std::input_iterator_tag;
  using value_type = Value;
  using difference_type = std::ptrdiff_t;
  using reference = const Value&;
  PassIterator() = default;
  explicit PassIterator(std::shared_ptr<Pass> p) : pass_(std::move(p)) { step(); }
  const Value& operator*() const { return current_of(pass_->current); }
  const Value* operator->() const { return &**this; }
  PassIterator& operator++() {
    step();
    return *this;
  }
  PassIterator operator++(int) {
    auto t = *this;
    ++*this;
    return t;
  }
  friend bool operator==(const PassIterator& a, const PassIterator& b) { return a.pass_ == b.pass_; }
  friend bool operator==(const PassIterator& a, std::default_sentinel_t) { return a.pass_ == nullptr; }

 private:
  void step() {
    if (pass_->advance()) return;
    if constexpr (requires(Pass & p) { p.finish(); }) pass_->finish();
    pass_.reset();
  }
  std::shared_ptr<Pass> pass_;
};

}  // namespace accel::data::detail
