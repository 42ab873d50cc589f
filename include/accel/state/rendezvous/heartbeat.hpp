#pragma once
//! \file
//! The heartbeat of a `Rendezvous` (state/rendezvous/rendezvous.hpp): the thread that writes this rank's beat key (its
//! count, its failure, its last collectives), on ranks 0 and 1 aggregates every rank's into a summary, reads the
//! summary while someone waits, looks for a rank that ended (Note [Ended ranks] in state/rendezvous/job_identity.hpp),
//! and repairs this rank's one-shot keys until the engine is connected, and the snapshot it shares with the other
//! threads.
//!
//! The heartbeat is the only thread that talks to the store after the rendezvous, on a connection of its own:
//! a store op to a frozen host never returns, so nothing else may wait on one. What it learns goes into a
//! snapshot that the waiting thread reads under a lock; a heartbeat stuck on a frozen store is seen as a
//! snapshot that stopped ageing, and is abandoned (detached) when the process ends.
//!
//! Note [The heartbeat at scale]
//! Hundreds of ranks share one store (a c10d TCPStore: one thread serving every request), so the heartbeat's
//! traffic grows O(N) in total, never O(N^2) (measured by benchmarks/heartbeat_sim.cpp; README, "Scale: a job of
//! 1,024 ranks"):
//! - every rank writes its beat key once a heartbeat, in one compare-and-set against what it wrote last (a foreign
//!   writer is found by the same request: `JobStore::rewrite`);
//! - rank 0, the aggregator, reads every rank's beat key in one check and one multi-get a heartbeat, and publishes
//!   `summary/0` (`Summary`, state/rendezvous/summary.hpp): the ranks whose beat has not changed for two heartbeats and
//!   for how long (the 64 oldest), the ranks that failed, the collectives on which ranks differ (the earliest 16), and
//!   the rank its launcher reported ended;
//! - a rank that watches or waits reads the summary once a heartbeat, in one request that never blocks
//!   (`JobStore::peek`), and judges from it: a rank late by more than the peer timeout is frozen (Note [Frozen
//!   peers]), a failed rank ends the wait, a differing collective is a mismatch;
//! - while a collective waits, each rank also looks at the launcher's `ended` key between beats, no more often
//!   than every N x 0.5 ms (about 2,000 looks a second for the job; from about 1,000 ranks on, once a heartbeat,
//!   through the summary).
//! The aggregator's summary is also its own beat: a summary that stops advancing is rank 0 frozen. Rank 1, its
//! deputy, reads `summary/0` every heartbeat; when it has not advanced for three heartbeats, rank 1 aggregates and
//! publishes `summary/1` (which lists rank 0 late like any other), and every watching rank reads it too while
//! rank 0's is stale. So a frozen aggregator is named like any other rank, within the peer timeout plus a few
//! heartbeats; what the deputy cannot see is a rank that froze in the same moment as rank 0 (its age counts from
//! the deputy's first look). Both frozen: every watching rank names ranks 0 and 1 when neither summary has
//! advanced for the peer timeout. Ages are measured by the aggregator's clock from its own first look, so no
//! clock is compared across machines.

#include <accel/comm/collective_id.hpp>
#include <accel/state/rendezvous/listen.hpp>
#include <accel/state/rendezvous/store.hpp>
#include <accel/state/rendezvous/summary.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace accel::rendezvous {

namespace detail {

//! A `Rendezvous`'s heartbeat: its thread (`run`), and what the thread shares with the others (`Beat`).
struct Heartbeat {
  static constexpr std::size_t kPublished = 8;  // collectives each rank publishes
  static constexpr int kAggregators = 2;        // rank 0, and rank 1, its deputy (Note [The heartbeat at scale])

  //! What the heartbeat thread shares with the others (it outlives the Rendezvous when stuck on the store).
  struct Beat {
    std::string addr;
    int port = 0, rank = 0, size = 1;
    std::string prefix;
    comm::CommOptions opt;
    c10::intrusive_ptr<JobStore> kv;  // the main connection's (the heartbeat shares its secret, report and ledger)
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false, exited = false;
    std::thread::id thread;  // the heartbeat's
    // this rank
    std::array<comm::CollectiveId, kPublished> mine{};
    std::uint64_t issued = 0, published = 0;
    bool failed = false, failed_written = false;
    comm::Clock::time_point next_beat{};  // when the next beat is due
    // a rank that ended, as its launcher reported it (Note [Ended ranks]); looked for every quick look while
    // `waiters` > 0, and in every summary read
    int waiters = 0;
    std::optional<EndedRank> ended;
    comm::Clock::time_point ended_seen{};  // when this heartbeat found it
    // the others, as the aggregators' summaries say, read every beat while `watchers` or `waiters` > 0
    int watchers = 0;
    std::uint64_t epoch = 0;  // bumped when watching starts: changes are measured from then
    comm::Clock::time_point watch_began{};
    std::uint64_t rounds = 0;           // completed reads of the summaries
    comm::Clock::time_point last_ok{};  // the last beat the store answered
    struct Source {                     // one aggregator's summary
      bool seen = false;
      Summary summary;
      // When its round last changed, as this rank saw it (measured afresh after a gap in the reads: a summary is
      // only known stale from continuous reads), and when it was last read.
      comm::Clock::time_point advanced{}, read{};
      //! Whether it was read within two heartbeats of `now`: what it says is current.
      [[nodiscard]] bool recent(comm::Clock::time_point now, comm::Clock::duration interval) const {
        return seen && now - read <= interval * 2;
      }
    };
    std::array<Source, kAggregators> from;

    [[nodiscard]] std::string key(const char* what, int r) const { return prefix + what + "/" + std::to_string(r); }
    //! The summary to believe: the one that advanced last (rank 0's on a tie); null before any was read.
    [[nodiscard]] const Source* current() const {
      const Source* best = nullptr;
      for (const auto& s : from)
        if (s.seen && (!best || s.advanced > best->advanced)) best = &s;
      return best;
    }

    // ---- what the summaries say of the others (the lock held) ----

    // "rank 1 issued ...; rank 2 issued ..." for the ranks that published another operation under `own`'s number.
    [[nodiscard]] std::string differing(const comm::CollectiveId& own) const {
      constexpr std::size_t kNamed = 8;  // ranks named one by one per operation; the others as ranges
      std::string out;
      std::set<std::string> said;
      for (const auto& src : from) {
        if (!src.seen) continue;
        for (const auto& m : src.summary.mismatches)
          for (const auto& v : m) {
            if (v.id.seq != own.seq || v.id == own || !said.insert(v.id.encode()).second) continue;
            std::vector<int> ranks;
            for (int r : v.ranks)
              if (r != rank && r < size) ranks.push_back(r);
            for (std::size_t i = 0; i < ranks.size() && i < kNamed; ++i)
              out += (out.empty() ? "" : "; ") + ("rank " + std::to_string(ranks[i]) + " issued " + v.id.describe());
            if (ranks.size() > kNamed)
              out += "; " + std::to_string(ranks.size() - kNamed) + " more ranks (" +
                     Summary::ranks_text(std::vector<int>(ranks.begin() + kNamed, ranks.end())) + ") issued " +
                     v.id.describe();
          }
      }
      return out;
    }
    // Whether aggregator `a`'s summary is expected now: rank 0's always (on the others), the deputy's on ranks 2 and
    // up once their continuous reads show rank 0's stale for three heartbeats (when the deputy takes over).
    [[nodiscard]] bool aggregator_expected(int a) const {
      if (a == rank || size < 2) return false;
      if (a == 0) return true;
      const auto now = comm::Clock::now();
      return rank >= 2 && from[0].recent(now, opt.heartbeat_interval) &&
             now - from[0].advanced > opt.heartbeat_interval * 3;
    }
    // When aggregator `a`'s summary last advanced, as this rank's continuous reads saw it (else when the watch began);
    // the deputy's counts from two heartbeats after it was due to take over at the earliest.
    [[nodiscard]] comm::Clock::time_point since(int a) const {
      const auto& s = from[std::size_t(a)];
      const auto seen =
          s.recent(comm::Clock::now(), opt.heartbeat_interval) ? s.advanced : std::max(s.advanced, watch_began);
      return a == 0 ? seen : std::max(seen, from[0].advanced + opt.heartbeat_interval * 5);
    }
    // The ranks silent for the peer timeout and those that failed, as the summaries say ("rank 2, rank 5").
    [[nodiscard]] std::pair<std::string, std::string> others(comm::Clock::time_point now) const {
      std::set<int> silent;
      std::string failed;
      if (const auto* cur = current(); cur && cur->recent(now, opt.heartbeat_interval)) {
        for (int r : cur->summary.failed)
          if (r != rank && r < size) failed += (failed.empty() ? "rank " : ", rank ") + std::to_string(r);
        // Ages as published, plus the time since this rank read them (at most a heartbeat: a summary that stopped
        // advancing says nothing new).
        const auto extra = std::min<comm::Clock::duration>(now - cur->read, opt.heartbeat_interval);
        for (const auto& l : cur->summary.late)
          if (l.rank != rank && l.rank < size && std::chrono::milliseconds(l.age_ms) + extra > opt.peer_timeout)
            silent.insert(l.rank);
      }
      for (int a = 0; a < kAggregators && a < size; ++a)
        if (aggregator_expected(a) && now - since(a) > opt.peer_timeout) silent.insert(a);
      std::string out;
      for (int r : silent) out += (out.empty() ? "rank " : ", rank ") + std::to_string(r);
      return {out, failed};
    }
  };

  static std::string encode(const std::array<comm::CollectiveId, kPublished>& mine, std::uint64_t issued) {
    std::string out;
    for (std::uint64_t s = issued >= kPublished ? issued - kPublished + 1 : 1; s <= issued; ++s)
      out += mine[s % kPublished].encode() + ";";
    return out;
  }
  static std::vector<comm::CollectiveId> decode(const std::string& s) {
    std::vector<comm::CollectiveId> out;
    std::size_t start = 0, end;
    while ((end = s.find(';', start)) != std::string::npos) {
      if (auto id = comm::CollectiveId::decode(s.substr(start, end - start))) out.push_back(*id);
      start = end + 1;
    }
    return out;
  }

  //! What an aggregator keeps of every rank between its beats.
  struct Peer {
    std::int64_t beats = -1;
    comm::Clock::time_point changed{};
    std::vector<comm::CollectiveId> published;
    bool failed = false;
  };

  //! One beat of an aggregator: every rank's beat key in one multi-get, and the summary of them.
  static Summary aggregate(JobStore& store, const Beat& b, const std::vector<std::string>& keys,
                           std::vector<Peer>& peers, std::uint64_t round, const std::optional<EndedRank>& ended) {
    const auto values = store.try_get_all(keys);
    const auto now = comm::Clock::now();
    Summary s;
    s.round = round, s.ended = ended;
    std::vector<std::vector<comm::CollectiveId>> published(std::size_t(b.size));
    for (int r = 0; r < b.size; ++r) {
      auto& p = peers[std::size_t(r)];
      if (p.changed == comm::Clock::time_point{}) p.changed = now;  // ages count from the aggregator's first look
      if (const auto& v = values[std::size_t(r)]) {
        std::istringstream in(std::string(v->begin(), v->end()));
        std::int64_t beats = -1;
        int failed = 0;
        if (in >> beats >> failed) {  // not written yet, or not authentic: what was known stands
          if (beats != p.beats) p.changed = now;
          p.beats = beats, p.failed = failed != 0;
          std::string rest;
          std::getline(in, rest);  // the end of the first line
          std::getline(in, rest);
          p.published = decode(rest);
        }
      }
      const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.changed);
      if (age >= b.opt.heartbeat_interval * 2) s.late.push_back({r, std::int64_t(age.count())});
      if (p.failed) s.failed.push_back(r);
      published[std::size_t(r)] = p.published;
    }
    s.mismatches = Summary::differences(published);
    // The latest ranks when many are (a summary every rank reads twice a second stays small).
    if (s.late.size() > Summary::kLate) {
      std::partial_sort(s.late.begin(), s.late.begin() + std::ptrdiff_t(Summary::kLate), s.late.end(),
                        [](const auto& x, const auto& y) { return x.age_ms > y.age_ms; });
      s.late.resize(Summary::kLate);
      std::sort(s.late.begin(), s.late.end(), [](const auto& x, const auto& y) { return x.rank < y.rank; });
    }
    return s;
  }

  // The heartbeat: writes this rank's beat key (its count, its failure, its last collectives) in one request;
  // on ranks 0 and 1, aggregates every rank's into a summary (Note [The heartbeat at scale]); reads the summary
  // while someone watches or waits; looks for a rank that ended every quick look while someone waits (Note
  // [Ended ranks]); and repairs this rank's one-shot keys until the engine is connected. Only `b` is touched:
  // the thread may outlive the Rendezvous.
  static void run(std::shared_ptr<Beat> b) {
    c10::intrusive_ptr<JobStore> own;
    try {
      own = b->kv->sharing(connect_store(b->addr, b->port, b->opt.rendezvous_timeout));
    } catch (const std::exception&) {
    }
    auto bytes = [](const std::string& v) { return std::vector<uint8_t>(v.begin(), v.end()); };
    const std::string ended_key = b->prefix + EndedRank::key_name;  // the attempt's prefix: EndedRank::key
    const bool lead = b->rank == 0 && b->size > 1, deputy = b->rank == 1;
    const auto started = comm::Clock::now();
    std::vector<Peer> peers(lead || deputy ? std::size_t(b->size) : 0);
    std::vector<std::string> beat_keys;  // every rank's beat key, for an aggregator (made once, read every beat)
    for (int r = 0; r < int(peers.size()); ++r) beat_keys.push_back(b->key("beat", r));
    std::int64_t beats = 0;
    std::string published;                               // the collectives last encoded
    std::vector<std::uint8_t> written, summary_written;  // the keys' bytes as last written (sealed)
    bool full = true;                                    // a beat; otherwise a quick look at the ended key alone
    // Quick looks while someone waits: from 5 ms, doubling up to `quick_look()`; with many ranks no more often
    // than every `size` x 0.5 ms, so that the job's looks stay near 2,000 a second (at 1,024 ranks: a heartbeat).
    const auto floor = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::microseconds(500) * b->size);
    const auto first_look = std::max(std::min(std::chrono::milliseconds(5), b->opt.quick_look()), floor);
    const auto last_look = std::max(b->opt.quick_look(), floor);
    auto step = first_look;
    std::unique_lock<std::mutex> lock(b->mu);
    while (own && !b->stop) {
      const std::uint64_t issued = b->issued;
      if (full && issued != b->published) published = encode(b->mine, issued);
      const bool fail = b->failed;
      const bool watching = b->watchers > 0 || b->waiters > 0 || deputy;
      const bool read = watching && b->size > 1;
      const bool look = !b->ended.has_value();
      // The deputy aggregates while rank 0's summary has not advanced for three heartbeats.
      const auto stale = b->opt.heartbeat_interval * 3;
      const bool aggregating =
          lead || (deputy && comm::Clock::now() - (b->from[0].seen ? b->from[0].advanced : started) > stale);
      lock.unlock();
      std::optional<EndedRank> ended;
      std::optional<Summary> got[kAggregators];
      try {
        // The ended key before the beats: a rank that ended wrote its last beat before its launcher reported it,
        // so what is read next is its last word (a mismatch it published, its failure).
        if (look && (aggregating || !full))
          if (const auto v = own->try_get(ended_key))
            if ((ended = EndedRank::decode(std::string(v->begin(), v->end()))) &&
                (ended->rank == b->rank || ended->rank >= b->size))
              ended.reset();
        if (full) {
          // A compare-and-set: a foreign writer is reported, even when nobody reads the key before it is written again.
          const std::string beat = std::to_string(++beats) + " " + (fail ? "1" : "0") + "\n" + published;
          written = own->rewrite(b->key("beat", b->rank), written, bytes(beat));
          own->repair();
          if (aggregating) {
            lock.lock();
            const std::optional<EndedRank> known = ended ? ended : b->ended;
            lock.unlock();
            got[b->rank] = aggregate(*own, *b, beat_keys, peers, std::uint64_t(beats), known);
            summary_written = own->rewrite(b->key("summary", b->rank), summary_written, bytes(got[b->rank]->encode()));
          }
          if (read) {
            // Rank 0's summary, unless this rank wrote it; the deputy's too while rank 0's is stale.
            lock.lock();
            const bool want1 = b->size > 2 && !(deputy && aggregating) &&
                               (!b->from[0].seen || comm::Clock::now() - b->from[0].advanced > stale);
            lock.unlock();
            for (int a = 0; a < kAggregators; ++a)
              if (a != b->rank && (a == 0 || want1))
                if (const auto v = own->peek(b->key("summary", a)))
                  got[a] = Summary::decode(std::string(v->begin(), v->end()));
          }
        }
      } catch (const std::exception&) {
        if (!lock.owns_lock()) lock.lock();
        break;  // the store is gone: the waiting thread sees `last_ok` age
      }
      lock.lock();
      const auto now = comm::Clock::now();
      if (full) {
        b->last_ok = now;
        b->published = issued;
        if (fail) b->failed_written = true;
        b->next_beat = now + b->opt.heartbeat_interval;
      }
      bool fresh = false;
      for (int a = 0; a < kAggregators; ++a) {
        if (!got[a]) continue;
        auto& src = b->from[std::size_t(a)];
        if (!src.recent(now, b->opt.heartbeat_interval) || src.summary.round != got[a]->round) src.advanced = now;
        src.seen = true, src.read = now, src.summary = std::move(*got[a]), fresh = true;
        if (!ended && src.summary.ended && src.summary.ended->rank != b->rank && src.summary.ended->rank < b->size)
          ended = src.summary.ended;
      }
      if (full && watching) ++b->rounds;  // one rank alone has no summary to read: a round all the same
      const bool found = ended.has_value() && !b->ended;
      if (found) b->ended = std::move(ended), b->ended_seen = now;
      if ((full && watching) || found || fresh) b->cv.notify_all();
      // Sleep until the next beat, or a quick look while someone waits and no rank is known to have ended; less
      // when someone starts watching or waiting, fails, or stops us.
      const std::uint64_t e = b->epoch;
      const bool hurried = b->waiters > 0 && !b->ended && first_look < b->opt.heartbeat_interval;
      const auto until = hurried ? std::min(b->next_beat, now + step) : b->next_beat;
      step = hurried ? std::min(step * 2, last_look) : first_look;
      b->cv.wait_until(lock, until, [&] {
        return b->stop || b->epoch != e || (b->failed && !b->failed_written) ||
               (!hurried && b->waiters > 0 && !b->ended && first_look < b->opt.heartbeat_interval);
      });
      if (b->epoch != e) step = first_look;  // a census, or a watch, begins: look soon again
      // A beat when it is due, or when someone starts watching or fails; a quick look otherwise.
      full = comm::Clock::now() >= b->next_beat || b->stop || b->epoch != e || (b->failed && !b->failed_written);
    }
    b->exited = true;
    b->cv.notify_all();
  }
};

}  // namespace detail

}  // namespace accel::rendezvous
