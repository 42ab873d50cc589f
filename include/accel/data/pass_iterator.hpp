#pragma once
//! \file
//! The input iterator of the streaming views (`BatchSamplerShard`, `IterableShard`): one pass over the source,
//! shared by the iterator's copies; each step asks the pass to `advance()`, and the iterator equals the
//! sentinel when it cannot.

#include <iterator>
#include <memory>

namespace accel::data::detail {

template <class Pass, class Value>
class PassIterator {
 public:
  using iterator_concept = std::input_iterator_tag;
  using iterator_category = std::input_iterator_tag;
  using value_type = Value;
  using difference_type = std::ptrdiff_t;
  using reference = const Value&;
  PassIterator() = default;
  explicit PassIterator(std::shared_ptr<Pass> p) : pass_(std::move(p)) {
    if (!pass_->advance()) pass_.reset();
  }
  const Value& operator*() const { return pass_->current; }
  PassIterator& operator++() {
    if (!pass_->advance()) pass_.reset();
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
  std::shared_ptr<Pass> pass_;
};

}  // namespace accel::data::detail
