#pragma once
//! \file
//! The exceptions accel throws for bad input at run time. Every message names the problem and the fix.

#include <stdexcept>
#include <string>
#include <utility>

//! Everything a training loop writes beside the `Accelerator` (Accelerate's top-level names): the `Accelerator`,
//! `Options`, the prepared wrappers, schedulers, `GradScaler`, the collectives, the errors (include/accel/README.md,
//! "Namespaces").
namespace accel {

//! Base of every error accel raises.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! An argument, a parameter combination or an environment variable that accel cannot work with.
struct InvalidArgument : Error {
  using Error::Error;
};

//! A collective or the rendezvous failed (a peer died, froze, never arrived, or timed out; the rendezvous store
//! held values that fail authentication).
struct CommunicationError : Error {
  using Error::Error;
};
//! Ranks issued different collectives at the same point (comm/communicator.hpp, Note [Mismatched collectives]).
struct CollectiveMismatch : CommunicationError {
  using CommunicationError::CommunicationError;
};

//! A file accel reads (a checkpoint's file, a tool's input) that is missing, truncated, damaged or not what it
//! claims to be. The message starts with the file's path and says what is wrong with it; `path()` is that path.
struct FileError : Error {
  //! An error about the file `path`: the message is `path: what`.
  FileError(std::string path, const std::string& what) : Error(path + ": " + what), path_(std::move(path)) {}
  //! The file the error is about.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

namespace detail {
//! Throws `InvalidArgument(message)` unless `ok`.
inline void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument(message);
}
}  // namespace detail

}  // namespace accel
