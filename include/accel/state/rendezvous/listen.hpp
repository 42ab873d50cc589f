#pragma once
//! \file
//! Where the job's rendezvous store (state/rendezvous/store.hpp) listens, and its connections: the address a store for
//! a master address listens on (`listen_address`), the socket accel binds for it (`listen_on`), the store hosted there
//! (`host_store`) and a client of it (`connect_store`).
//!
//! Note [Listening surface]
//! c10d's `TCPStore` server listens on every interface. accel binds the socket itself and hands it to the server
//! (`TCPStoreOptions::masterListenFd`): a loopback master address (127.0.0.0/8, ::1, localhost) is a job on one
//! host, and its store listens on loopback only; any other master address must be an address of the host that
//! runs the store, and the store listens on that address alone, never on the wildcard. Gloo binds its own
//! sockets to one address already (comm/gloo.hpp).

#include <accel/error.hpp>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace accel::rendezvous {

// ---- where the store listens (Note [Listening surface]) -----------------------------------------------------

//! Address helpers of the listening surface.
namespace net {
//! The numeric address of `sa` ("10.0.0.1", "::1").
inline std::string numeric(const sockaddr* sa) {
  char host[NI_MAXHOST];
  const socklen_t len = sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::getnameinfo(sa, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return {};
  std::string h = host;
  if (const auto pct = h.find('%'); pct != std::string::npos) h.resize(pct);  // fe80::1%eth0
  return h;
}
//! The numeric addresses `host` resolves to.
inline std::vector<std::string> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::vector<std::string> out;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* a = res; a; a = a->ai_next)
    if (auto h = numeric(a->ai_addr); !h.empty() && std::find(out.begin(), out.end(), h) == out.end()) out.push_back(h);
  ::freeaddrinfo(res);
  return out;
}
}  // namespace net

//! Whether `addr` (a name or a numeric address) stays on this host: 127.0.0.0/8, ::1, or a name that resolves
//! (to `resolved`) only to those.
inline bool is_loopback(const std::string& addr, const std::vector<std::string>& resolved) {
  auto numeric_loopback = [](const std::string& a) {
    return a.rfind("127.", 0) == 0 || a == "::1" || a == "::ffff:127.0.0.1";
  };
  return numeric_loopback(addr) ||
         (!resolved.empty() && std::all_of(resolved.begin(), resolved.end(), numeric_loopback));
}

//! The numeric addresses of this host's interfaces.
inline std::vector<std::string> local_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6))
      if (auto h = net::numeric(i->ifa_addr); !h.empty()) out.push_back(h);
  ::freeifaddrs(list);
  return out;
}

//! Where a store for master address `addr` listens on this host: loopback for a loopback address, else the
//! one local address `addr` resolves to (never the wildcard). An address that is not this host's is an error.
inline std::string listen_address(const std::string& addr) {
  const auto resolved = net::resolve(addr);
  if (is_loopback(addr, resolved)) {
    if (addr.rfind("127.", 0) == 0) return addr;
    return std::find(resolved.begin(), resolved.end(), "127.0.0.1") != resolved.end() || resolved.empty()
               ? "127.0.0.1"
               : resolved.front();
  }
  if (resolved.empty())
    throw InvalidArgument("accel: the master address '" + addr +
                          "' (MASTER_ADDR / --master-addr) does not resolve; give "
                          "the address or name of the host that runs rank 0 (or node 0's accel-launch)");
  const auto mine = local_addresses();
  for (const auto& r : resolved)
    if (std::find(mine.begin(), mine.end(), r) != mine.end()) return r;
  std::string list;
  for (const auto& r : resolved) list += (list.empty() ? "" : ", ") + r;
  throw InvalidArgument("accel: this process hosts the rendezvous store, but the master address '" + addr + "' (" +
                        list +
                        ") is not an address of this host, and the store listens only on the master address (never "
                        "on every interface); run rank 0 (or node 0's accel-launch) on that host, or set MASTER_ADDR "
                        "to one of this host's addresses (127.0.0.1 for a job on one host)");
}

//! A socket listening on `addr:port` (port 0: a free one), for the store server to take over.
struct ListenSocket {
  int fd = -1;   //!< the socket
  int port = 0;  //!< the port it listens on
};
//! A socket listening on `addr:port` (port 0: a free one); an address this machine does not have is an error.
inline ListenSocket listen_on(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &res); rc != 0 || !res)
    throw CommunicationError("accel: cannot listen on '" + addr + "': " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw CommunicationError(std::string("accel: cannot create the store's socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 2048) != 0) {
    const int err = errno;
    ::close(fd);
    throw CommunicationError("accel: cannot listen on " + addr + ":" + service + ": " + std::strerror(err) +
                             (err == EADDRINUSE ? " (another job, or a store left over, holds the port: choose another "
                                                  "MASTER_PORT / --master-port)"
                                                : ""));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int p = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return {fd, p};
}

//! Hosts the job's store for master address `addr` on `port` (0: a free one): the server listens where
//! `listen_address` says; the returned client of this process talks to it there.
inline c10::intrusive_ptr<c10d::TCPStore> host_store(const std::string& addr, int port,
                                                     std::chrono::milliseconds timeout) {
  const std::string at = listen_address(addr);
  const ListenSocket s = listen_on(at, port);
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(s.port);
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = timeout;
  o.masterListenFd = s.fd;
  try {
    return c10::make_intrusive<c10d::TCPStore>(at, o);
  } catch (...) {
    ::close(s.fd);
    throw;
  }
}

//! Connects to the job's store at `addr:port`.
inline c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& addr, int port,
                                                        std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(addr, o);
}

}  // namespace accel::rendezvous
