#pragma once
//! \file
//! The CPU engine: c10d `ProcessGroupGloo` over accel's rendezvous store (what `torchrun` + Accelerate use
//! for MULTI_CPU). Kept apart because `ProcessGroupGloo.hpp` costs ~10 s per translation unit.

#include <accel/comm/communicator.hpp>
#include <accel/state/launch_env.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <memory>
#include <string>

namespace accel::comm {

//! Rendezvous at the launcher's address and connect its processes with Gloo. The network interface is
//! `GLOO_SOCKET_IFNAME` when set (as in PyTorch), else the address that reaches `addr` (loopback jobs stay
//! on 127.0.0.1).
inline std::unique_ptr<Communicator> make_gloo_communicator(const LaunchEnv& env, const CommOptions& opt) {
  const std::string& addr = env.master_addr;
  const int rank = env.rank, size = env.world_size;
  auto rdzv = std::make_unique<Rendezvous>(env, opt);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = opt.timeout;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (addr == "127.0.0.1" || addr == "localhost" || addr == "::1")
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(addr));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    auto store = c10::make_intrusive<c10d::PrefixStore>("accel/gloo", rdzv->store());
    backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (const auto cut = msg.find('\n'); cut != std::string::npos) msg.resize(cut);
    throw CommunicationError("accel: rank " + std::to_string(rank) + ": connecting " + std::to_string(size) +
                             " processes with Gloo failed: " + msg + ". " + rdzv->census() + ".");
  }
  return std::make_unique<Communicator>(std::move(rdzv), std::move(backend), rank, size, opt);
}

}  // namespace accel::comm
