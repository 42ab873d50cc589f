#pragma once
//! \file
//! The job's rendezvous store made safe to expose: where it listens, which keys are the job's, and who may
//! write them. Used by the rendezvous (state/rendezvous/rendezvous.hpp) and by accel-launch, which hosts the store of
//! its jobs. Where it listens and its connections are in state/rendezvous/listen.hpp (Note [Listening surface]), the
//! job's id and secret in state/rendezvous/job_identity.hpp (Note [Job keys]); this header holds the authenticated
//! store (`Seal`, `JobStore`) and includes both.
//!
//! Note [Authenticated keys]
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
#include <accel/state/rendezvous/job_identity.hpp>
#include <accel/state/rendezvous/listen.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

namespace accel::rendezvous {

// ---- authenticated values (Note [Authenticated keys]) -------------------------------------------------------

//! HMAC-SHA256 of a key and its value under the job secret: `seal` appends the tag, `open` checks and strips it.
//! After `close_for_exit` (Note [Exit] in state/rendezvous/rendezvous.hpp) every tag is refused with an `Error`:
//! OpenSSL frees its state in its own exit handler, and a thread still running then must not call into it.
class Seal {
 public:
  static constexpr std::size_t tag_size = 32;  //!< bytes of an HMAC-SHA256 tag
  //! A seal under `secret`.
  explicit Seal(std::string secret) : secret_(std::move(secret)) {
    // OpenSSL registers its exit handler here at the latest, so that the handler accel registers after a
    // connection (Note [Exit]) runs before it.
    OPENSSL_init_crypto(0, nullptr);
  }
  //! From now on no thread of this process computes a tag: waits for those computing one, then refuses every
  //! later call. Run by the process's exit handler, before OpenSSL's.
  static void close_for_exit() noexcept {
    std::unique_lock<std::shared_mutex> lock(gate());
    closed() = true;
  }

  //! `value` followed by the tag of `key` and `value`.
  [[nodiscard]] std::vector<std::uint8_t> seal(const std::string& key, const std::vector<std::uint8_t>& value) const {
    std::vector<std::uint8_t> out(value);
    out.resize(value.size() + tag_size);
    tag(key, value.data(), value.size(), out.data() + value.size());
    return out;
  }
  //! `sealed` without its tag when the tag is `key`'s and the value's; none otherwise.
  [[nodiscard]] std::optional<std::vector<std::uint8_t>> open(const std::string& key,
                                                              const std::vector<std::uint8_t>& sealed) const {
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
    std::shared_lock<std::shared_mutex> lock(gate());
    if (closed()) throw Error("accel: the process is exiting: no more authenticated store values");
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), secret_.data(), int(secret_.size()), msg.data(), msg.size(), out, &len) || len != tag_size)
      throw Error("accel: HMAC-SHA256 failed (OpenSSL)");
  }
  // Never destroyed: a thread left behind on a frozen store may reach them during the process's exit.
  static std::shared_mutex& gate() {
    static auto* m = new std::shared_mutex;
    return *m;
  }
  static bool& closed() {
    static auto* b = new bool(false);
    return *b;
  }
  std::string secret_;
};

//! The store requests of this process, every connection of every `JobStore` together (a request is one round trip
//! to the store; a multi-get of N keys is one request and N keys): what a job costs its store, which at hundreds
//! of ranks is the resource the heartbeat must spare (Note [The heartbeat at scale] in state/rendezvous/heartbeat.hpp).
//! accel-launch prints its own with `ACCEL_STORE_TRAFFIC=1`.
struct StoreTraffic {
  //!@{
  //! Requests, and keys named by them.
  std::uint64_t requests = 0, keys = 0;
  //!@}
  //! This process's totals so far.
  [[nodiscard]] static StoreTraffic now() noexcept {
    return {counters().requests.load(std::memory_order_relaxed), counters().keys.load(std::memory_order_relaxed)};
  }
  //! Counts one request that names `keys` keys.
  static void count(std::size_t keys = 1) noexcept {
    counters().requests.fetch_add(1, std::memory_order_relaxed);
    counters().keys.fetch_add(keys, std::memory_order_relaxed);
  }

 private:
  struct Atomic {
    std::atomic<std::uint64_t> requests{0}, keys{0};
  };
  static Atomic& counters() noexcept {
    static auto* c = new Atomic;  // never destroyed: a heartbeat left behind may count during the exit
    return *c;
  }
};

//! The job's keys on its store: with a job secret, every value sealed on write and checked on read (Note
//! [Authenticated keys]); without one, the values pass as they are. Either way, a key this process keeps
//! rewriting (the heartbeat's) can be checked for a foreign writer (`holds`). Instances made with `sharing`
//! (another connection of the same process) share the report and the ledger of one-shot keys to repair.
class JobStore final : public c10d::Store {
 public:
  //! What the instances of one process share: which keys were reported, and the one-shot keys it wrote.
  struct Shared {
    std::string who;                 //!< this process in reports: "rank 1", "accel-launch (node 0)"
    std::mutex mu;                   //!< guards the rest
    std::set<std::string> reported;  //!< keys already reported as replaced
    std::map<std::string, std::vector<std::uint8_t>> ledger;  //!< key -> sealed value, while repairing
    bool repairing = false;                                   //!< from the first write with a secret to `settled`
  };

  //! `secret` empty: values are not sealed.
  JobStore(c10::intrusive_ptr<c10d::Store> inner, const std::string& secret, std::string who)
      : JobStore(std::move(inner), secret.empty() ? nullptr : std::make_shared<const Seal>(secret),
                 std::make_shared<Shared>()) {
    shared_->who = std::move(who);
    shared_->repairing = bool(seal_);
  }
  //! A store over `inner` with `seal` (null: not sealed), sharing `shared` with the process's other connections.
  JobStore(c10::intrusive_ptr<c10d::Store> inner, std::shared_ptr<const Seal> seal, std::shared_ptr<Shared> shared)
      : c10d::Store(inner->getTimeout()),
        inner_(std::move(inner)),
        seal_(std::move(seal)),
        shared_(std::move(shared)) {}

  //! Another connection of the same process: the same secret, report and ledger.
  [[nodiscard]] c10::intrusive_ptr<JobStore> sharing(c10::intrusive_ptr<c10d::Store> inner) const {
    return c10::make_intrusive<JobStore>(std::move(inner), seal_, shared_);
  }
  //! Whether values are sealed with a job secret.
  [[nodiscard]] bool authenticated() const noexcept { return bool(seal_); }

  //! Another connection of the same process (c10d's `clone`), sharing the secret, report and ledger.
  c10::intrusive_ptr<c10d::Store> clone() override { return sharing(inner_->clone()); }

  //! Writes `value` under `key`, sealed (c10d's `set`).
  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    auto sealed = seal(key, value);
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (shared_->repairing) shared_->ledger[key] = sealed;
    }
    req()->set(key, sealed);
  }
  //! Writes `value` to a key this process keeps rewriting (the heartbeat's; never repaired) in one request, a
  //! compare-and-set against `written` (what the previous call returned; empty the first time): a key that no
  //! longer holds it was replaced or deleted by a foreign writer, which is reported once, and written again.
  //! Returns the bytes written (the next call's `written`).
  std::vector<std::uint8_t> rewrite(const std::string& key, const std::vector<std::uint8_t>& written,
                                    const std::vector<std::uint8_t>& value) {
    auto sealed = seal(key, value);
    if (written.empty()) {  // the first write: nothing of ours to compare with
      req()->set(key, sealed);
      return sealed;
    }
    if (req()->compareSet(key, written, sealed) != sealed) {
      report(key, replaced_text());
      req()->set(key, sealed);
    }
    return sealed;
  }

  //! The authentic value of `key`, waiting for it to exist (c10d's `get`); a forged value is reported and waited past.
  std::vector<std::uint8_t> get(const std::string& key) override {
    if (auto o = open_or_report(key, req()->get(key))) return std::move(*o);  // waits for the key to exist
    return authentic(key, Clock::now() + timeout_);  // a forged value: wait for an authentic one
  }
  //! The authentic value of `key`, or nothing when it is absent or fails (reported); never blocks on absence.
  std::optional<std::vector<std::uint8_t>> try_get(const std::string& key) {
    if (!req()->check({key})) return std::nullopt;
    return open_or_report(key, req()->get(key));
  }

  //! The authentic value of `key`, or nothing when it is absent or fails (reported), in one request that never
  //! blocks: a compare-and-set whose expected value no writer of the job writes (a single zero byte)
  //! returns what the key holds, and changes nothing.
  std::optional<std::vector<std::uint8_t>> peek(const std::string& key) {
    static const std::vector<std::uint8_t> none{0};
    auto held = req()->compareSet(key, none, none);
    if (held == none) return std::nullopt;  // absent
    return open_or_report(key, held);
  }
  //! The authentic values of `keys` (nothing for one absent or failing, reported), in two requests (a check and a
  //! multi-get) when they all exist; one by one otherwise. Never blocks on absence.
  std::vector<std::optional<std::vector<std::uint8_t>>> try_get_all(const std::vector<std::string>& keys) {
    std::vector<std::optional<std::vector<std::uint8_t>>> out;
    out.reserve(keys.size());
    if (keys.empty()) return out;
    if (req(keys.size())->check(keys)) {
      const auto values = req(keys.size())->multiGet(keys);
      for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(open_or_report(keys[i], values[i]));
    } else {
      for (const auto& k : keys) out.push_back(try_get(k));
    }
    return out;
  }

  //! c10d's `compareSet` on sealed values; a forged value holding the key is reported and replaced by this write.
  std::vector<std::uint8_t> compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                       const std::vector<std::uint8_t>& desired) override {
    const auto sealed = seal(key, desired);
    auto held = req()->compareSet(key, expected.empty() ? expected : seal(key, expected), sealed);
    if (auto o = open_or_report(key, held)) return std::move(*o);
    // A forged value holds the key: it is not trusted, and the authentic write takes its place.
    req()->set(key, sealed);
    return desired;
  }

  //! Whether every key exists (c10d's `check`).
  bool check(const std::vector<std::string>& keys) override {
    if (!req(keys.size())->check(keys)) return false;
    if (!seal_) return true;
    for (const auto& k : keys)
      if (!open_or_report(k, req()->get(k))) return false;
    return true;
  }
  //! Waits until every key exists, within the store's timeout (c10d's `wait`).
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  //! Waits until every key exists, within `timeout` (c10d's `wait`).
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    req(keys.size())->wait(keys, timeout);
    if (!seal_) return;
    for (const auto& k : keys) authentic(k, deadline);
  }

  //! c10d's `add`: a counter (not sealed; accel decides nothing on one).
  int64_t add(const std::string& key, int64_t value) override { return req()->add(key, value); }
  //! c10d's `deleteKey`.
  bool deleteKey(const std::string& key) override { return req()->deleteKey(key); }
  //! c10d's `getNumKeys`.
  int64_t getNumKeys() override { return req()->getNumKeys(); }
  //! c10d's `setTimeout`: how long this connection's waits last.
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
    std::vector<std::string> keys;
    for (const auto& [k, sealed] : ledger) keys.push_back(k);
    // Every key at once when they all exist (two requests a beat, whatever their number), else one by one.
    std::vector<std::vector<std::uint8_t>> held;
    if (!keys.empty() && req(keys.size())->check(keys)) held = req(keys.size())->multiGet(keys);
    std::size_t i = 0;
    for (const auto& [k, sealed] : ledger) {
      const bool same = held.empty() ? !replaced(k, sealed) : held[i] == sealed;
      if (!same && !held.empty()) report(k, replaced_text());
      if (!same) req()->set(k, sealed);
      ++i;
    }
  }
  //! The engine is connected: one-shot keys are read no more, and need no repair.
  void settled() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->repairing = false;
    shared_->ledger.clear();
  }

 private:
  using Clock = std::chrono::steady_clock;
  // The connection, for one request naming `keys` keys (counted: StoreTraffic).
  [[nodiscard]] c10d::Store* req(std::size_t keys = 1) const {
    StoreTraffic::count(keys);
    return inner_.get();
  }
  [[nodiscard]] std::vector<std::uint8_t> seal(const std::string& key, const std::vector<std::uint8_t>& v) const {
    return seal_ ? seal_->seal(key, v) : v;
  }
  std::optional<std::vector<std::uint8_t>> open_or_report(const std::string& key, const std::vector<std::uint8_t>& v) {
    if (!seal_) return v;
    if (auto o = seal_->open(key, v)) return o;
    report(key,
           "fails authentication (not written by a process of this job: a foreign client, or a process with "
           "another ACCEL_JOB_SECRET); ignored");
    return std::nullopt;
  }
  // The first authentic value of an existing `key` before `deadline` (a waiting reader outlasts a foreign writer).
  std::vector<std::uint8_t> authentic(const std::string& key, Clock::time_point deadline) {
    for (;;) {
      if (auto o = open_or_report(key, req()->get(key))) return std::move(*o);
      if (Clock::now() >= deadline) throw forged_for(key);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // Whether `key` no longer holds `sealed`, as this process wrote it (reported once).
  bool replaced(const std::string& key, const std::vector<std::uint8_t>& sealed) {
    if (req()->check({key}) && req()->get(key) == sealed) return false;
    report(key, replaced_text());
    return true;
  }
  [[nodiscard]] const char* replaced_text() const {
    return seal_ ? "was replaced by a value this process did not write (a client outside the job); written again"
                 : "was replaced by a value this process did not write (a client outside the job; set "
                   "ACCEL_JOB_SECRET to authenticate values)";
  }
  void report(const std::string& key, const std::string& what) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->reported.insert(key + what).second) return;
    std::fprintf(stderr, "accel: %s: the rendezvous store's key '%s' %s\n", shared_->who.c_str(), key.c_str(),
                 what.c_str());
  }
  [[nodiscard]] CommunicationError forged_for(const std::string& key) const {
    return CommunicationError("accel: " + shared_->who + ": the rendezvous store's key '" + key +
                              "' held no authentic "
                              "value within " +
                              std::to_string(timeout_.count()) +
                              " ms, only values that fail "
                              "authentication: the process that writes it has another job secret (give every process "
                              "the same ACCEL_JOB_SECRET or ACCEL_JOB_SECRET_FILE; accel-launch passes its own to the "
                              "processes it starts), or a client outside the job keeps overwriting it");
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  std::shared_ptr<const Seal> seal_;  // null: no secret
  std::shared_ptr<Shared> shared_;
};

}  // namespace accel::rendezvous
