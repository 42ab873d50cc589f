#pragma once
//! \file
//! The job's rendezvous store made safe to expose: where it listens, which keys are the job's, and who may
//! write them. Used by the rendezvous (comm/rendezvous.hpp) and by accel-launch, which hosts the store of its jobs.
//!
//! Note [Listening surface]
//! ~~~~~~~~~~~~~~~~~~~~~~~~
//! c10d's `TCPStore` server listens on every interface. accel binds the socket itself and hands it to the server
//! (`TCPStoreOptions::masterListenFd`): a loopback master address (127.0.0.0/8, ::1, localhost) is a job on one
//! host, and its store listens on loopback only; any other master address must be an address of the host that
//! runs the store, and the store listens on that address alone, never on the wildcard. Gloo binds its own
//! sockets to one address already (comm/gloo.hpp).
//!
//! Note [Job keys]
//! ~~~~~~~~~~~~~~~
//! Every key lives under `accel/<job id>/<restart generation>/` (the launcher's under `accel-launch/<job id>/`):
//! two jobs, or two attempts of one job, that meet on one port never read each other's keys. The id is
//! `ACCEL_JOB_ID` (accel-launch generates one, or takes `--job-id`), else the scheduler's (torchrun's
//! `TORCHELASTIC_RUN_ID`, SLURM's `SLURM_JOB_ID.SLURM_STEP_ID`, PMIx's namespace, PBS, LSF), else `none`.
//!
//! Note [Authenticated keys]
//! ~~~~~~~~~~~~~~~~~~~~~~~~~
//! With a job secret (`ACCEL_JOB_SECRET`, or the file `ACCEL_JOB_SECRET_FILE` names; accel-launch generates one
//! for a job on one host), every value a process writes carries an HMAC-SHA256 of the key and the value
//! (OpenSSL), and every value read is checked: a value that fails is reported once by the name of its key and
//! ignored, never trusted. The store cannot stop a foreign client from overwriting a key, so what the job
//! needs survives it: a waiting reader keeps waiting for an authentic value, the writer of a one-shot key
//! (arrival, engine addresses) rewrites it when it finds it replaced (`JobStore::repair`, run by the
//! heartbeat until the engine is connected), and the heartbeat rewrites its key every beat. Counters (`add`)
//! cannot carry a tag: accel decides nothing on a counter. A process whose secret differs from the others'
//! sees every other rank's values fail, and the others see its: the rendezvous names it and stops.

#include <accel/error.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace accel::comm {

// ---- the job's identity ---------------------------------------------------------------------------------------

//! Who the job is on its store: the id its keys live under, and the secret its values are sealed with (empty:
//! not authenticated).
struct JobIdentity {
  std::string id = "none";
  std::string secret;
};

//! Checks a job id: letters, digits, `.`, `_`, `-`, at most 128 characters (it becomes part of every key).
inline void check_job_id(const std::string& id, const std::string& source) {
  const bool ok = !id.empty() && id.size() <= 128 &&
                  std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; });
  if (!ok)
    throw InvalidArgument("accel: the job id " + source + "='" + id + "' is not usable in store keys; use 1-128 letters, "
                          "digits, '.', '_' or '-'");
}

//! Reads a secret file: its content without the trailing newline; refused when others than its owner may read it.
inline std::string read_secret_file(const std::string& path) {
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InvalidArgument("accel: the job secret file '" + path + "' (ACCEL_JOB_SECRET_FILE) cannot be read: " + std::strerror(errno));
  if (st.st_mode & 077)
    throw InvalidArgument("accel: the job secret file '" + path + "' may be read by others than its owner (mode " +
                          [&] { char b[8]; std::snprintf(b, sizeof b, "%03o", unsigned(st.st_mode & 0777)); return std::string(b); }() +
                          "); chmod 600 it");
  if (st.st_size > 4096)
    throw InvalidArgument("accel: the job secret file '" + path + "' is " + std::to_string(st.st_size) +
                          " bytes; a secret is at most 4096 bytes (e.g. `openssl rand -hex 32 > file`)");
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw InvalidArgument("accel: the job secret file '" + path + "' is empty");
  return s;
}

//! The job secret from `ACCEL_JOB_SECRET` (the secret itself) or `ACCEL_JOB_SECRET_FILE` (a file holding it,
//! readable by its owner only); empty when neither is set.
template <class Env>
std::string job_secret_from(const Env& env) {
  const auto value = env("ACCEL_JOB_SECRET");
  const auto file = env("ACCEL_JOB_SECRET_FILE");
  if (value && !value->empty() && file && !file->empty())
    throw InvalidArgument("accel: both ACCEL_JOB_SECRET and ACCEL_JOB_SECRET_FILE are set; keep one");
  if (file && !file->empty()) return read_secret_file(*file);
  if (value && !value->empty()) {
    if (value->size() < 16)
      throw InvalidArgument("accel: ACCEL_JOB_SECRET is " + std::to_string(value->size()) +
                            " characters; use at least 16 (e.g. `openssl rand -hex 32`)");
    return *value;
  }
  return {};
}

//! The job id from `ACCEL_JOB_ID`, else the scheduler's (Note [Job keys]), else "none".
template <class Env>
std::string job_id_from(const Env& env) {
  auto get = [&](const char* name) -> std::string {
    const auto v = env(name);
    return v ? *v : std::string();
  };
  auto clean = [](std::string s) {  // scheduler ids may hold characters keys should not ("1234.pbs-server")
    for (char& c : s)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
    return s.substr(0, 128);
  };
  if (auto id = get("ACCEL_JOB_ID"); !id.empty()) {
    check_job_id(id, "ACCEL_JOB_ID");
    return id;
  }
  if (auto id = get("TORCHELASTIC_RUN_ID"); !id.empty() && id != "none") return clean("torchrun-" + id);
  if (auto id = get("SLURM_JOB_ID"); !id.empty()) {
    const auto step = get("SLURM_STEP_ID");
    return clean("slurm-" + id + (step.empty() ? "" : "." + step));
  }
  if (auto id = get("PMIX_NAMESPACE"); !id.empty()) return clean("pmix-" + id);
  if (auto id = get("OMPI_MCA_ess_base_jobid"); !id.empty()) return clean("ompi-" + id);
  if (auto id = get("PBS_JOBID"); !id.empty()) return clean("pbs-" + id);
  if (auto id = get("LSB_JOBID"); !id.empty()) return clean("lsf-" + id);
  return "none";
}

//! `bytes` random bytes from the kernel, as hex (job ids and secrets that accel-launch generates).
inline std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> b(bytes);
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  const bool ok = f && std::fread(b.data(), 1, b.size(), f) == b.size();
  if (f) std::fclose(f);
  if (!ok) throw Error("accel: cannot read /dev/urandom to generate a job id or secret");
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) out += digits[c >> 4], out += digits[c & 15];
  return out;
}

// ---- where the store listens (Note [Listening surface]) -----------------------------------------------------

namespace net {
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
  auto numeric_loopback = [](const std::string& a) { return a.rfind("127.", 0) == 0 || a == "::1" || a == "::ffff:127.0.0.1"; };
  return numeric_loopback(addr) || (!resolved.empty() && std::all_of(resolved.begin(), resolved.end(), numeric_loopback));
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
    return std::find(resolved.begin(), resolved.end(), "127.0.0.1") != resolved.end() || resolved.empty() ? "127.0.0.1" : resolved.front();
  }
  if (resolved.empty())
    throw InvalidArgument("accel: the master address '" + addr + "' (MASTER_ADDR / --master-addr) does not resolve; give "
                          "the address or name of the host that runs rank 0 (or node 0's accel-launch)");
  const auto mine = local_addresses();
  for (const auto& r : resolved)
    if (std::find(mine.begin(), mine.end(), r) != mine.end()) return r;
  std::string list;
  for (const auto& r : resolved) list += (list.empty() ? "" : ", ") + r;
  throw InvalidArgument("accel: this process hosts the rendezvous store, but the master address '" + addr + "' (" + list +
                        ") is not an address of this host, and the store listens only on the master address (never "
                        "on every interface); run rank 0 (or node 0's accel-launch) on that host, or set MASTER_ADDR "
                        "to one of this host's addresses (127.0.0.1 for a job on one host)");
}

//! A socket listening on `addr:port` (port 0: a free one), for the store server to take over.
struct ListenSocket {
  int fd = -1;
  int port = 0;
};
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
                                                  "MASTER_PORT / --master-port)" : ""));
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
inline c10::intrusive_ptr<c10d::TCPStore> host_store(const std::string& addr, int port, std::chrono::milliseconds timeout) {
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
inline c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& addr, int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(addr, o);
}

// ---- authenticated values (Note [Authenticated keys]) -------------------------------------------------------

//! HMAC-SHA256 of a key and its value under the job secret: `seal` appends the tag, `open` checks and strips it.
class Seal {
 public:
  static constexpr std::size_t tag_size = 32;
  explicit Seal(std::string secret) : secret_(std::move(secret)) {}

  [[nodiscard]] std::vector<std::uint8_t> seal(const std::string& key, const std::vector<std::uint8_t>& value) const {
    std::vector<std::uint8_t> out(value);
    out.resize(value.size() + tag_size);
    tag(key, value.data(), value.size(), out.data() + value.size());
    return out;
  }
  [[nodiscard]] std::optional<std::vector<std::uint8_t>> open(const std::string& key, const std::vector<std::uint8_t>& sealed) const {
    if (sealed.size() < tag_size) return std::nullopt;
    const std::size_t n = sealed.size() - tag_size;
    unsigned char expect[tag_size];
    tag(key, sealed.data(), n, expect);
    if (CRYPTO_memcmp(expect, sealed.data() + n, tag_size) != 0) return std::nullopt;
    return std::vector<std::uint8_t>(sealed.begin(), sealed.begin() + std::ptrdiff_t(n));
  }

 private:
  // The key, a zero byte, the value: a value can be moved to no other key.
  void tag(const std::string& key, const std::uint8_t* value, std::size_t n, unsigned char* out) const {
    std::vector<std::uint8_t> msg(key.begin(), key.end());
    msg.push_back(0);
    msg.insert(msg.end(), value, value + n);
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), secret_.data(), int(secret_.size()), msg.data(), msg.size(), out, &len) || len != tag_size)
      throw Error("accel: HMAC-SHA256 failed (OpenSSL)");
  }
  std::string secret_;
};

//! The job's keys on its store: with a job secret, every value sealed on write and checked on read (Note
//! [Authenticated keys]); without one, the values pass as they are. Either way, a key this process keeps
//! rewriting (the heartbeat's) can be checked for a foreign writer (`holds`). Instances made with `sharing`
//! (another connection of the same process) share the report and the ledger of one-shot keys to repair.
class JobStore final : public c10d::Store {
 public:
  //! What the instances of one process share: which keys were reported, and the one-shot keys it wrote.
  struct Shared {
    std::string who;  // "rank 1", "accel-launch (node 0)"
    std::mutex mu;
    std::set<std::string> reported;
    std::map<std::string, std::vector<std::uint8_t>> ledger;  // key -> sealed value, while repairing
    bool repairing = false;                                    // from the first write with a secret to `settled`
  };

  //! `secret` empty: values are not sealed.
  JobStore(c10::intrusive_ptr<c10d::Store> inner, const std::string& secret, std::string who)
      : JobStore(std::move(inner), secret.empty() ? nullptr : std::make_shared<const Seal>(secret), std::make_shared<Shared>()) {
    shared_->who = std::move(who);
    shared_->repairing = bool(seal_);
  }
  JobStore(c10::intrusive_ptr<c10d::Store> inner, std::shared_ptr<const Seal> seal, std::shared_ptr<Shared> shared)
      : c10d::Store(inner->getTimeout()), inner_(std::move(inner)), seal_(std::move(seal)), shared_(std::move(shared)) {}

  //! Another connection of the same process: the same secret, report and ledger.
  [[nodiscard]] c10::intrusive_ptr<JobStore> sharing(c10::intrusive_ptr<c10d::Store> inner) const {
    return c10::make_intrusive<JobStore>(std::move(inner), seal_, shared_);
  }
  //! Whether values are sealed with a job secret.
  [[nodiscard]] bool authenticated() const noexcept { return bool(seal_); }

  c10::intrusive_ptr<c10d::Store> clone() override { return sharing(inner_->clone()); }

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    auto sealed = seal(key, value);
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (shared_->repairing) shared_->ledger[key] = sealed;
    }
    inner_->set(key, sealed);
  }
  //! Like `set`, but never repaired: keys rewritten anyway (the heartbeat's).
  void set_volatile(const std::string& key, const std::vector<std::uint8_t>& value) { inner_->set(key, seal(key, value)); }
  //! Whether `key` still holds `value` as this process wrote it; reports it once when another writer replaced it.
  bool holds(const std::string& key, const std::vector<std::uint8_t>& value) { return !replaced(key, seal(key, value)); }

  std::vector<std::uint8_t> get(const std::string& key) override {
    if (auto o = open_or_report(key, inner_->get(key))) return std::move(*o);  // waits for the key to exist
    return authentic(key, Clock::now() + timeout_);                          // a forged value: wait for an authentic one
  }
  //! The authentic value of `key`, or nothing when it is absent or fails (reported); never blocks on absence.
  std::optional<std::vector<std::uint8_t>> try_get(const std::string& key) {
    if (!inner_->check({key})) return std::nullopt;
    return open_or_report(key, inner_->get(key));
  }

  std::vector<std::uint8_t> compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                       const std::vector<std::uint8_t>& desired) override {
    const auto sealed = seal(key, desired);
    auto held = inner_->compareSet(key, expected.empty() ? expected : seal(key, expected), sealed);
    if (auto o = open_or_report(key, held)) return std::move(*o);
    // A forged value holds the key: it is not trusted, and the authentic write takes its place.
    inner_->set(key, sealed);
    return desired;
  }

  bool check(const std::vector<std::string>& keys) override {
    if (!inner_->check(keys)) return false;
    if (!seal_) return true;
    for (const auto& k : keys)
      if (!open_or_report(k, inner_->get(k))) return false;
    return true;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    inner_->wait(keys, timeout);
    if (!seal_) return;
    for (const auto& k : keys) authentic(k, deadline);
  }

  int64_t add(const std::string& key, int64_t value) override { return inner_->add(key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void setTimeout(const std::chrono::milliseconds& timeout) override {
    c10d::Store::setTimeout(timeout);
    inner_->setTimeout(timeout);
  }

  //! Rewrites the one-shot keys this process wrote that no longer hold its value (a foreign client replaced them).
  void repair() {
    std::map<std::string, std::vector<std::uint8_t>> ledger;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->repairing) return;
      ledger = shared_->ledger;
    }
    for (const auto& [k, sealed] : ledger)
      if (replaced(k, sealed)) inner_->set(k, sealed);
  }
  //! The engine is connected: one-shot keys are read no more, and need no repair.
  void settled() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->repairing = false;
    shared_->ledger.clear();
  }

 private:
  using Clock = std::chrono::steady_clock;
  [[nodiscard]] std::vector<std::uint8_t> seal(const std::string& key, const std::vector<std::uint8_t>& v) const {
    return seal_ ? seal_->seal(key, v) : v;
  }
  std::optional<std::vector<std::uint8_t>> open_or_report(const std::string& key, const std::vector<std::uint8_t>& v) {
    if (!seal_) return v;
    if (auto o = seal_->open(key, v)) return o;
    report(key, "fails authentication (not written by a process of this job: a foreign client, or a process with "
                "another ACCEL_JOB_SECRET); ignored");
    return std::nullopt;
  }
  // The first authentic value of an existing `key` before `deadline` (a waiting reader outlasts a foreign writer).
  std::vector<std::uint8_t> authentic(const std::string& key, Clock::time_point deadline) {
    for (;;) {
      if (auto o = open_or_report(key, inner_->get(key))) return std::move(*o);
      if (Clock::now() >= deadline) throw forged_for(key);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // Whether `key` no longer holds `sealed`, as this process wrote it (reported once).
  bool replaced(const std::string& key, const std::vector<std::uint8_t>& sealed) {
    if (inner_->check({key}) && inner_->get(key) == sealed) return false;
    report(key, seal_ ? "was replaced by a value this process did not write (a client outside the job); written again"
                      : "was replaced by a value this process did not write (a client outside the job; set "
                        "ACCEL_JOB_SECRET to authenticate values)");
    return true;
  }
  void report(const std::string& key, const std::string& what) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->reported.insert(key + what).second) return;
    std::fprintf(stderr, "accel: %s: the rendezvous store's key '%s' %s\n", shared_->who.c_str(), key.c_str(), what.c_str());
  }
  [[nodiscard]] CommunicationError forged_for(const std::string& key) const {
    return CommunicationError("accel: " + shared_->who + ": the rendezvous store's key '" + key + "' held no authentic "
                              "value within " + std::to_string(timeout_.count()) + " ms, only values that fail "
                              "authentication: the process that writes it has another job secret (give every process "
                              "the same ACCEL_JOB_SECRET or ACCEL_JOB_SECRET_FILE; accel-launch passes its own to the "
                              "processes it starts), or a client outside the job keeps overwriting it");
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  std::shared_ptr<const Seal> seal_;  // null: no secret
  std::shared_ptr<Shared> shared_;
};

}  // namespace accel::comm
