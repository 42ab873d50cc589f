#pragma once
//! \file
//! The exceptions accel throws for bad input at run time. Every message names the problem and the fix.

#include <stdexcept>
#include <string>

namespace accel {

//! Base of every error accel raises.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! An argument, a parameter combination or an environment variable that accel cannot work with.
struct InvalidArgument : Error {
  using Error::Error;
};

namespace detail {
//! Throws `InvalidArgument(message)` unless `ok`.
inline void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument(message);
}
}  // namespace detail

}  // namespace accel
