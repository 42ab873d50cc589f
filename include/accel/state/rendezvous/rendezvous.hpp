#pragma once
//! \file
//! `Rendezvous`: where the processes of a job meet. A c10d `TCPStore` (hosted by rank 0, or by the launcher;
//! listening only where state/rendezvous/store.hpp says, its keys under the job's id, its values sealed with the job's
//! secret when there is one), every rank announcing itself (a missing rank is named), and a heartbeat per
//! process that publishes this rank's last collectives and, while someone waits, reads what rank 0 gathered of the
//! other ranks' (the
//! `Monitor` of communicator.hpp: Notes [Dead peers], [Frozen peers], [Mismatched collectives]). The engines
//! (Gloo, NCCL) exchange their addresses through its store.
//!
//! The keys, under `accel/<job id>/<generation>/`: `arrived/<rank>` (written once), `beat/<rank>` (every beat:
//! "<beats> <failed>" and the last collectives), `summary/0` and `summary/1` (the aggregator's and its deputy's:
//! Note [The heartbeat at scale] in state/rendezvous/heartbeat.hpp), `job/...` (the engines' own: Gloo's addresses,
//! NCCL's id), and `ended` (written by the launcher: Note [Ended ranks] in state/rendezvous/job_identity.hpp).
//!
//! The heartbeat thread, and the snapshot it shares with the waiting thread, are state/rendezvous/heartbeat.hpp.
//!
//! Note [Exit]
//! A process that ends normally (`main` returns, `std::exit`, a `Preempted` caught and returned from) runs its exit
//! handlers in the reverse order of their registration, interleaved with the destructors of static objects. accel's
//! threads must not outlive what they use: the heartbeat signs every beat with OpenSSL's HMAC, and OpenSSL frees its
//! state in an exit handler of its own; the engine (c10d's ProcessGroupGloo, NCCL) has threads and sockets of its own.
//! So accel decides what runs at exit, before any library it uses cleans up:
//! 1. `ProcessState`'s handler, registered once the process state is connected (after every library the connection
//!    initialised registered its own), releases the process state: the communicator is destroyed (the engine's
//!    threads joined, the heartbeat stopped and joined, the store left) while every library is whole.
//! 2. The rendezvous' handler, registered after OpenSSL's (the job's `Seal` initialises OpenSSL first), stops and joins
//!    every heartbeat still running (a process state someone still holds; joined, because a thread still ending
//!    while OpenSSL cleans up frees OpenSSL's per-thread state twice) and closes the seal (state/rendezvous/store.hpp):
//!    a heartbeat left behind on a frozen store refuses to sign after that and ends its loop.
//! An exception that leaves `main` ends the process through `std::terminate` and `abort`: no destructor runs,
//! nothing is freed, and the terminate handler publishes the failure (`Rendezvous::on_terminate`); preemption's
//! `std::_Exit` likewise runs nothing. Checked by `example.train.exit_soak.*` (the example stopped and resumed many
//! times in a row beside a CPU hog: no abnormal exit).

#include <accel/comm/collective_id.hpp>
#include <accel/state/rendezvous/heartbeat.hpp>
#include <accel/state/rendezvous/spec.hpp>
#include <accel/state/rendezvous/store.hpp>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace accel::rendezvous {

//! The rendezvous: the store, every rank announcing itself, and the heartbeat.
class Rendezvous final : public comm::Monitor {
  //! The collectives each rank publishes.
  static constexpr std::size_t kPublished = detail::Heartbeat::kPublished;
  static constexpr int kAggregators = detail::Heartbeat::kAggregators;
  //! What the heartbeat thread shares with the others (state/rendezvous/heartbeat.hpp).
  using Beat = detail::Heartbeat::Beat;

 public:
  //! Meets the job as `spec` says: rank 0 hosts the store (or connects to the launcher's), every rank arrives, and the
  //! heartbeat starts.
  Rendezvous(const RendezvousSpec& spec, const comm::CommOptions& opt)
      : addr_(spec.addr),
        port_(spec.port),
        rank_(spec.rank),
        size_(spec.size),
        host_(spec.host_store),
        prefix_(job_prefix(spec.job.id, spec.generation)),
        opt_(opt) {
    check_job_id(spec.job.id, "of the job");
    const int rank = rank_;
    const auto t0 = comm::Clock::now();
    try {
      raw_ = rank == 0 && spec.host_store ? host_store(addr_, port_, opt.rendezvous_timeout)
                                          : connect_store(addr_, port_, opt.rendezvous_timeout);
    } catch (const InvalidArgument&) {
      throw;
    } catch (const std::exception& e) {
      throw CommunicationError("accel: rank " + std::to_string(rank) + ": could not reach the rendezvous store at " +
                               where() + " within " + seconds(opt.rendezvous_timeout) + " (" + host() +
                               " hosts it: is it running, "
                               "and are MASTER_ADDR/MASTER_PORT the same on every process?): " +
                               e.what());
    }
    kv_ = c10::make_intrusive<JobStore>(raw_, spec.job.secret, "rank " + std::to_string(rank));
    store_ = c10::make_intrusive<c10d::PrefixStore>(prefix_ + "job", kv_);
    kv_->set(arrived_key(rank), std::vector<uint8_t>{1});
    // The heartbeat starts now: it repairs this rank's one-shot keys while the others arrive and connect.
    beat_ = std::make_shared<Beat>();
    beat_->addr = addr_, beat_->port = port_, beat_->rank = rank_, beat_->size = size_, beat_->prefix = prefix_;
    beat_->opt = opt_;
    beat_->kv = kv_;
    beat_->last_ok = comm::Clock::now();
    heartbeat_ = std::thread([b = beat_] { detail::Heartbeat::run(b); });
    enlist(this, true);
    {
      std::lock_guard<std::mutex> lock(beat_->mu);
      beat_->thread = heartbeat_.get_id();
    }
    try {
      await_arrivals(t0);
    } catch (...) {
      enlist(this, false);
      stop_heartbeat();
      throw;
    }
  }

  ~Rendezvous() override {
    Rendezvous* self = this;
    active().compare_exchange_strong(self, nullptr);
    enlist(this, false);
    stop_heartbeat();
  }
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  //! The job's store, scoped by the job id and the restart generation (the engines exchange their addresses
  //! through it); its values are authenticated when the job has a secret.
  [[nodiscard]] c10::intrusive_ptr<c10d::Store> store() const noexcept { return store_; }
  //! "address:port" of the store, for messages.
  [[nodiscard]] std::string where() const { return addr_ + ":" + std::to_string(port_); }
  //! The engine is connected: the one-shot keys are read no more (Note [Authenticated keys]).
  void settled() { kv_->settled(); }
  //! How long ago the store last answered this rank's beat: the age of its beat key as the others read it (a
  //! diagnostic; benchmarks/heartbeat_sim.cpp samples it).
  [[nodiscard]] comm::Clock::duration beat_age() const {
    std::lock_guard<std::mutex> lock(beat_->mu);
    return comm::Clock::now() - beat_->last_ok;
  }

 private:
  void stop_heartbeat() {
    if (!heartbeat_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(beat_->mu);
      beat_->stop = true;
    }
    beat_->cv.notify_all();
    // A heartbeat blocked on a frozen store never returns: wait a little, then leave it behind.
    std::unique_lock<std::mutex> lock(beat_->mu);
    const bool ended = beat_->cv.wait_for(lock, opt_.heartbeat_interval * 2 + std::chrono::seconds(1),
                                          [this] { return beat_->exited; });
    lock.unlock();
    if (ended)
      heartbeat_.join();
    else
      heartbeat_.detach();
  }

  // Every rank's arrival key, authentic (with a secret): a rank whose values all fail is named and refused.
  void await_arrivals(comm::Clock::time_point t0) {
    const auto left = [&] {
      return std::max(
          std::chrono::milliseconds(1),
          opt_.rendezvous_timeout - std::chrono::duration_cast<std::chrono::milliseconds>(comm::Clock::now() - t0));
    };
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(arrived_key(r));
    try {
      raw_->wait(keys, left());
    } catch (const std::exception&) {
      std::string missing;
      int arrived = 0;
      for (int r = 0; r < size_; ++r) {
        if (raw_->check({arrived_key(r)}))
          ++arrived;
        else
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw CommunicationError("accel: rank " + std::to_string(rank_) + ": rendezvous at " + where() + ": only " +
                               std::to_string(arrived) + " of " + std::to_string(size_) + " processes arrived within " +
                               seconds(opt_.rendezvous_timeout) + "; missing rank(s): " + missing + ". Start all " +
                               std::to_string(size_) +
                               " processes (accel-launch --nproc-per-node), or "
                               "check WORLD_SIZE");
    }
    if (!kv_->authenticated()) return;
    // A rank has arrived once one authentic arrival value of it was seen. A value replaced by a foreign client
    // is rewritten by its writer (here, and by the heartbeat); a rank with another secret writes values that
    // fail for good: wait this long before calling it so.
    const auto grace = std::max<comm::Clock::duration>(std::chrono::seconds(3), opt_.heartbeat_interval * 6);
    const auto since = comm::Clock::now();
    std::vector<bool> seen(std::size_t(size_), false),
        forged(std::size_t(size_), false);  // forged: failed, none passed yet
    const auto failing = [&] {
      std::string out;
      for (int r = 0; r < size_; ++r)
        if (forged[std::size_t(r)]) out += (out.empty() ? "" : ", ") + std::to_string(r);
      return out;
    };
    for (;;) {
      try {
        // The arrival values not yet seen authentic, in one multi-get (a request per rank, not per rank and key).
        std::vector<std::string> keys;
        std::vector<int> who;
        for (int r = 0; r < size_; ++r)
          if (!seen[std::size_t(r)]) keys.push_back(arrived_key(r)), who.push_back(r);
        const auto values = kv_->try_get_all(keys);
        for (std::size_t i = 0; i < who.size(); ++i) {
          const int r = who[i];
          if (values[i])
            seen[std::size_t(r)] = true, forged[std::size_t(r)] = false;
          else if (r == rank_)
            kv_->set(arrived_key(r), std::vector<uint8_t>{1});  // ours, replaced: again
          else
            forged[std::size_t(r)] = true;
        }
      } catch (const std::exception& e) {
        if (failing().empty())
          throw CommunicationError("accel: rank " + std::to_string(rank_) + ": lost the rendezvous store at " +
                                   where() + " while the processes arrived: " + e.what());
        break;  // the others gave up on us first
      }
      if (std::all_of(seen.begin(), seen.end(), [](bool b) { return b; })) return;
      const auto now = comm::Clock::now();
      if (!failing().empty() && (now - since > grace || now - t0 > opt_.rendezvous_timeout)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw CommunicationError(
        "accel: rank " + std::to_string(rank_) + ": rendezvous at " + where() + ": the arrival of rank(s) " +
        failing() + " fails authentication with this process's job secret (for " + seconds(comm::Clock::now() - since) +
        "): the processes do not share one secret. Give every process the same ACCEL_JOB_SECRET or "
        "ACCEL_JOB_SECRET_FILE (accel-launch passes its own to the processes it starts; on several nodes, export "
        "the same secret to every node's accel-launch)");
  }

 public:
  // ---- Monitor ------------------------------------------------------------------------------------------

  void issued(const comm::CollectiveId& id) noexcept override {
    std::lock_guard<std::mutex> lock(beat_->mu);
    beat_->mine[id.seq % kPublished] = id;
    beat_->issued = id.seq;
  }

  [[nodiscard]] std::shared_ptr<void> watch() override {
    {
      std::lock_guard<std::mutex> lock(beat_->mu);
      if (beat_->watchers++ == 0) ++beat_->epoch, beat_->watch_began = comm::Clock::now();
    }
    beat_->cv.notify_all();                                         // read the others now, not at the next beat
    return std::shared_ptr<void>(beat_.get(), [b = beat_](void*) {  // not null: a guard that tests true
      std::lock_guard<std::mutex> lock(b->mu);
      --b->watchers;
    });
  }

  [[nodiscard]] std::shared_ptr<void> waiting() override {
    {
      std::lock_guard<std::mutex> lock(beat_->mu);
      ++beat_->waiters;
    }
    beat_->cv.notify_all();  // look now, not at the next beat
    return std::shared_ptr<void>(beat_.get(), [b = beat_](void*) {
      std::lock_guard<std::mutex> lock(b->mu);
      --b->waiters;
    });
  }

  [[nodiscard]] comm::Finding ended() const override {
    std::lock_guard<std::mutex> lock(beat_->mu);
    if (!ended_now_locked()) return {};
    return {comm::Finding::Kind::ended, ended_locked()};
  }

  [[nodiscard]] std::optional<comm::CollectiveId> own(std::uint64_t seq) const override {
    std::lock_guard<std::mutex> lock(beat_->mu);
    const comm::CollectiveId& c = beat_->mine[seq % kPublished];
    if (seq == 0 || c.seq != seq) return std::nullopt;  // not issued, or overwritten by a later one
    return c;
  }

  [[nodiscard]] std::string differing(const comm::CollectiveId& own) const override {
    std::lock_guard<std::mutex> lock(beat_->mu);
    return beat_->differing(own);
  }

  [[nodiscard]] comm::Finding verdict(const comm::CollectiveId& id) const override {
    using K = comm::Finding::Kind;
    std::lock_guard<std::mutex> lock(beat_->mu);
    const auto now = comm::Clock::now();
    if (now - beat_->last_ok > opt_.peer_timeout)
      return {K::silent, "the rendezvous store at " + where() + " has not answered for " +
                             seconds(now - beat_->last_ok) + " (peer timeout " + seconds(opt_.peer_timeout) +
                             "): not responding: " + host()};
    if (std::string others = beat_->differing(id); !others.empty()) return {K::mismatch, others};
    if (beat_->ended && beat_->ended->signal && ended_now_locked()) return {K::ended, ended_locked()};
    const auto [silent, failed] = beat_->others(now);
    if (!failed.empty()) return {K::failed, "failed (its error says why): " + failed};
    if (!silent.empty())
      return {K::silent, "not responding for " + seconds(opt_.peer_timeout) +
                             " (the peer timeout; its heartbeat stopped: "
                             "frozen, stopped or starved): " +
                             silent};
    if (ended_now_locked()) return {K::ended, ended_locked()};  // one that exited with a code, after its grace
    return {};
  }

  [[nodiscard]] comm::Finding census(const comm::CollectiveId* id) noexcept override {
    using K = comm::Finding::Kind;
    try {
      auto w = watch();
      auto hurry = waiting();  // a rank that ended, as its launcher reports it, ends the census at once
      failed();
      std::unique_lock<std::mutex> lock(beat_->mu);
      // Two reads of the others, three heartbeats apart (bounded: a frozen store never answers), unless a
      // launcher reports a rank that ended (Note [Ended ranks]).
      const auto interval = opt_.heartbeat_interval;
      const std::uint64_t r0 = beat_->rounds;
      const auto began = comm::Clock::now();
      beat_->cv.wait_for(lock, interval * 3, [&] { return beat_->rounds > r0; });
      if (beat_->rounds == r0)
        return {K::silent, host_ ? (rank_ == 0 ? "the rendezvous store is gone"
                                               : "not responding: rank 0 (it hosts the rendezvous store)")
                                 : "the rendezvous store at " + where() + " is gone (the launcher hosting it ended)"};
      std::uint64_t before[kAggregators];
      for (int a = 0; a < kAggregators; ++a) before[a] = beat_->from[std::size_t(a)].summary.round;
      const std::uint64_t r1 = beat_->rounds;
      const auto killed = [&] { return beat_->ended && beat_->ended->signal; };  // named at once (Note [Ended ranks])
      // Three reads, and four heartbeats since the census began: a rank that stopped before it is then at least two
      // heartbeats late in the summary read last (the aggregator sees a beat up to one heartbeat after it is written,
      // and this rank reads the summary up to one heartbeat after that).
      beat_->cv.wait_for(lock, interval * 5, [&] {
        return killed() || (beat_->rounds >= r1 + 3 && comm::Clock::now() >= began + interval * 4);
      });
      if (id)
        if (std::string others = beat_->differing(*id); !others.empty()) return {K::mismatch, others};
      // Stopped: a rank the summary lists as late (no new beat for two heartbeats), an aggregator whose summary did
      // not advance while this rank read it (Note [The heartbeat at scale]); a rank that failed is named as such.
      std::set<int> stopped, failing;
      const bool read = beat_->rounds > r1;
      if (const auto* cur = beat_->current()) {
        failing.insert(cur->summary.failed.begin(), cur->summary.failed.end());
        if (read)
          for (const auto& l : cur->summary.late) stopped.insert(l.rank);
      }
      for (int a = 0; a < kAggregators && a < size_; ++a)
        if (beat_->aggregator_expected(a) && comm::Clock::now() > beat_->since(a) + interval * 2 &&
            (!read || beat_->from[std::size_t(a)].summary.round == before[a]))
          stopped.insert(a);
      std::string dead, failed;
      const auto skip = [&](int r) { return r == rank_ || r >= size_ || (killed() && r == beat_->ended->rank); };
      for (int r : failing)
        if (!skip(r)) failed += (failed.empty() ? "rank " : ", rank ") + std::to_string(r);
      for (int r : stopped)
        if (!skip(r) && !failing.count(r) && !killed())
          dead += (dead.empty() ? "rank " : ", rank ") + std::to_string(r);
      std::string out = killed()       ? ended_locked()
                        : dead.empty() ? "no rank stopped responding (a timeout, or ranks in different operations?)"
                                       : "not responding: " + dead;
      if (!failed.empty()) out += "; also failed: " + failed;
      if (beat_->ended && !killed()) out += "; " + ended_locked();
      return {killed() ? K::ended : K::silent, out};
    } catch (...) {
      return {K::silent, "the census of the other ranks failed"};
    }
  }

  //! Makes `r` the rendezvous that a `std::terminate` of this process reports to (null: none): Gloo aborts a
  //! process that receives a message larger than its buffer (two ranks in collectives of different sizes). The
  //! handler publishes this rank's failure and last collectives, so that the others can name them, and says
  //! which collective the process was in; then the previous handler runs.
  static void on_terminate(Rendezvous* r) {
    static std::terminate_handler previous = nullptr;
    static bool installed = false;
    active() = r;
    if (installed || !r) return;
    installed = true;
    previous = std::set_terminate([] {
      if (Rendezvous* self = active().load()) self->fatal();
      if (previous) previous();
      std::abort();
    });
  }
  void failed() noexcept override {
    {
      std::lock_guard<std::mutex> lock(beat_->mu);
      beat_->failed = true;
    }
    beat_->cv.notify_all();
  }

 private:
  // ---- exit (Note [Exit]) ----

  // The rendezvous of this process, for the exit handler; the handler is registered with the first.
  static void enlist(Rendezvous* r, bool alive) {
    static const bool registered = std::atexit(&Rendezvous::at_exit) == 0;
    (void)registered;
    std::lock_guard<std::mutex> lock(exit_mutex());
    auto& all = living();
    if (alive)
      all.push_back(r);
    else
      std::erase(all, r);
  }
  // Stops and joins every heartbeat still running (one stuck on a frozen store is left behind after two beats and
  // a second), then closes the seal. Joined, not only stopped: a thread that is still ending while OpenSSL cleans up
  // frees OpenSSL's per-thread state a second time.
  static void at_exit() noexcept {
    std::lock_guard<std::mutex> lock(exit_mutex());
    for (Rendezvous* r : living()) r->stop_heartbeat();
    Seal::close_for_exit();
  }
  // Never destroyed: the exit handler runs among the destructors of static objects.
  static std::mutex& exit_mutex() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::vector<Rendezvous*>& living() {
    static auto* v = new std::vector<Rendezvous*>;
    return *v;
  }
  // "not responding: rank 2; its launcher reports that it was killed by signal 9 (Killed)", or for one that
  // exited with a code "rank 2 ended: its launcher reports that it exited with code 1" (the lock held).
  [[nodiscard]] std::string ended_locked() const {
    const auto& e = *beat_->ended;
    return (e.signal ? "not responding: rank " + std::to_string(e.rank) + ";"
                     : "rank " + std::to_string(e.rank) + " ended:") +
           " its launcher reports that it " + e.what;
  }
  // Whether the reported rank ends a wait now: one killed by a signal at once, one that exited with a code two
  // heartbeats after its report arrived (Note [Ended ranks]; the lock held).
  [[nodiscard]] bool ended_now_locked() const {
    return beat_->ended &&
           (beat_->ended->signal || comm::Clock::now() - beat_->ended_seen >= opt_.heartbeat_interval * 2);
  }
  static std::atomic<Rendezvous*>& active() {
    static std::atomic<Rendezvous*> r{nullptr};
    return r;
  }
  // The process is ending abruptly: publish the failure and the last collectives (bounded), and say where.
  // Not from the heartbeat thread itself (it may hold the lock, and it is the one that would publish).
  void fatal() noexcept {
    if (std::this_thread::get_id() == beat_->thread) return;
    std::unique_lock<std::mutex> lock(beat_->mu, std::defer_lock);
    if (!lock.try_lock()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!lock.try_lock()) return;
    }
    beat_->failed = true;
    const comm::CollectiveId last = beat_->mine[beat_->issued % kPublished];
    const bool any = beat_->issued > 0;
    lock.unlock();
    beat_->cv.notify_all();
    lock.lock();
    beat_->cv.wait_for(lock, opt_.heartbeat_interval * 2, [&] { return beat_->failed_written || beat_->exited; });
    if (any)
      std::fprintf(stderr,
                   "accel: rank %d: the process is ending abnormally in collective #%llu (%s); if the engine's "
                   "message speaks of a size mismatch, the ranks issued different collectives there\n",
                   rank_, static_cast<unsigned long long>(last.seq), last.describe().c_str());
  }
  static std::string seconds(comm::Clock::duration d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f s", std::chrono::duration<double>(d).count());
    return buf;
  }
  [[nodiscard]] std::string host() const { return host_ ? "rank 0" : "the launcher of node 0"; }
  [[nodiscard]] std::string arrived_key(int r) const { return prefix_ + "arrived/" + std::to_string(r); }
  std::string addr_;
  int port_, rank_, size_;
  bool host_;           // whether rank 0 hosts the store (else the launcher does)
  std::string prefix_;  // "accel/<job id>/<generation>/"
  comm::CommOptions opt_;
  c10::intrusive_ptr<c10d::TCPStore> raw_;  // the connection
  c10::intrusive_ptr<JobStore> kv_;         // raw_, sealing values with the job's secret when there is one
  c10::intrusive_ptr<c10d::Store> store_;   // kv_ under prefix_ + "job"
  std::shared_ptr<Beat> beat_;
  std::thread heartbeat_;
};

}  // namespace accel::rendezvous
