#pragma once
//! \file
//! The definition of `make_gloo_communicator` (declared in comm/connect.hpp), included by comm/gloo.hpp: header-only,
//! in every translation unit that includes that header; under ACCEL_SEPARATE_COMPILATION, in the one of <accel/src.hpp>
//! (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/comm/gloo.hpp>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <memory>
#include <string>

namespace accel::comm {

//! Rendezvous at the launcher's address and connect its processes with Gloo. The network interface is
//! `GLOO_SOCKET_IFNAME` when set (as in PyTorch), else the address that reaches `addr` (loopback jobs stay
//! on 127.0.0.1).
ACCEL_DECL std::unique_ptr<Communicator> make_gloo_communicator(const rendezvous::RendezvousSpec& spec,
                                                                const CommOptions& opt) {
  const std::string& addr = spec.addr;
  const int rank = spec.rank, size = spec.size;
  auto rdzv = std::make_unique<rendezvous::Rendezvous>(spec, opt);
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
                             " processes with Gloo failed: " + msg + ". " + rdzv->census(nullptr).text + ".");
  }
  // Every rank has read every address once all have connected: a barrier says so, and the one-shot keys need
  // no more repair (a rank may finish connecting before a peer has read its address).
  try {
    backend->barrier()->wait(opt.timeout);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (const auto cut = msg.find('\n'); cut != std::string::npos) msg.resize(cut);
    throw CommunicationError("accel: rank " + std::to_string(rank) + ": the first barrier of " + std::to_string(size) +
                             " processes connected with Gloo failed: " + msg + ". " + rdzv->census(nullptr).text + ".");
  }
  rdzv->settled();
  rendezvous::Rendezvous::on_terminate(rdzv.get());
  return std::make_unique<GlooCommunicator>(std::move(rdzv), std::move(backend), rank, size, opt);
}

}  // namespace accel::comm
