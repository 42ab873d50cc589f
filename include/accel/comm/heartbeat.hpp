#pragma once
//! \file
//! The heartbeat of a `Rendezvous` (comm/rendezvous.hpp): the thread that writes this rank's beat key (its
//! count, its failure, its last collectives), reads the other ranks' while someone waits, looks for a rank that
//! ended (Note [Ended ranks] in comm/job_identity.hpp), and repairs this rank's one-shot keys until the engine is
//! connected, and the snapshot it shares with the other threads.
//!
//! The heartbeat is the only thread that talks to the store after the rendezvous, on a connection of its own:
//! a store op to a frozen host never returns, so nothing else may wait on one. What it learns goes into a
//! snapshot that the waiting thread reads under a lock; a heartbeat stuck on a frozen store is seen as a
//! snapshot that stopped ageing, and is abandoned (detached) when the process ends.

#include <accel/comm/collective_id.hpp>
#include <accel/comm/listen.hpp>
#include <accel/comm/store.hpp>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace accel::comm {

namespace rendezvous_detail {

//! A `Rendezvous`'s heartbeat: its thread (`run`), and what the thread shares with the others (`Beat`).
struct Heartbeat {
  static constexpr std::size_t kPublished = 8;  // collectives each rank publishes

  //! What the heartbeat thread shares with the others (it outlives the Rendezvous when stuck on the store).
  struct Beat {
    std::string addr;
    int port = 0, rank = 0, size = 1;
    std::string prefix;
    CommOptions opt;
    c10::intrusive_ptr<JobStore> kv;  // the main connection's (the heartbeat shares its secret, report and ledger)
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false, exited = false;
    std::thread::id thread;  // the heartbeat's
    // this rank
    std::array<CollectiveId, kPublished> mine{};
    std::uint64_t issued = 0, published = 0;
    bool failed = false, failed_written = false;
    Clock::time_point next_beat{};  // when the next beat is due
    // a rank that ended, as its launcher reported it (Note [Ended ranks]); looked for every quick look while
    // `waiters` > 0, else every beat
    int waiters = 0;
    std::optional<EndedRank> ended;
    Clock::time_point ended_seen{};  // when this heartbeat found it
    // the others, read while `watchers` > 0
    int watchers = 0;
    std::uint64_t epoch = 0;        // bumped when watching starts: changes are measured from then
    std::uint64_t rounds = 0;       // completed reads of the others
    Clock::time_point last_ok{};    // the last beat the store answered
    struct Peer {
      std::int64_t beats = -1;
      Clock::time_point changed{};
      std::uint64_t epoch = 0;
      std::vector<CollectiveId> published;
      bool failed = false;
    };
    std::vector<Peer> peers;

    [[nodiscard]] std::string key(const char* what, int r) const { return prefix + what + "/" + std::to_string(r); }
  };

  static std::string encode(const std::array<CollectiveId, kPublished>& mine, std::uint64_t issued) {
    std::string out;
    for (std::uint64_t s = issued >= kPublished ? issued - kPublished + 1 : 1; s <= issued; ++s)
      out += mine[s % kPublished].encode() + ";";
    return out;
  }
  static std::vector<CollectiveId> decode(const std::string& s) {
    std::vector<CollectiveId> out;
    std::size_t start = 0, end;
    while ((end = s.find(';', start)) != std::string::npos) {
      if (auto id = CollectiveId::decode(s.substr(start, end - start))) out.push_back(*id);
      start = end + 1;
    }
    return out;
  }

  // The heartbeat: writes this rank's beat key (its count, its failure, its last collectives), reads the others'
  // while someone watches, looks for a rank that ended (every beat, and every quick look while someone waits:
  // Note [Ended ranks]), and repairs this rank's one-shot keys until the engine is connected. Only `b` is touched:
  // the thread may outlive the Rendezvous.
  static void run(std::shared_ptr<Beat> b) {
    c10::intrusive_ptr<JobStore> own;
    try {
      own = b->kv->sharing(connect_store(b->addr, b->port, b->opt.rendezvous_timeout));
    } catch (const std::exception&) {
    }
    auto bytes = [](const std::string& v) { return std::vector<uint8_t>(v.begin(), v.end()); };
    const std::string ended_key = b->prefix + EndedRank::key_name;  // the attempt's prefix: EndedRank::key
    std::int64_t beats = 0;
    std::string published;  // the collectives last encoded
    std::vector<std::uint8_t> written;  // the beat key's bytes as last written (sealed)
    bool full = true;  // a beat; otherwise a quick look at the ended key alone
    // The delay of the next quick look: from 5 ms, doubling up to `quick_look()` (a launcher sees a process end
    // a few milliseconds after its connections close; a long wait costs one look per quick look).
    const auto first_look = std::min(std::chrono::milliseconds(5), b->opt.quick_look());
    auto step = first_look;
    std::unique_lock<std::mutex> lock(b->mu);
    while (own && !b->stop) {
      const std::uint64_t issued = b->issued;
      if (full && issued != b->published) published = encode(b->mine, issued);
      const bool fail = b->failed;
      const bool watch = b->watchers > 0;
      const std::uint64_t epoch = b->epoch;
      const bool look = !b->ended.has_value();
      lock.unlock();
      std::vector<Beat::Peer> seen;
      std::optional<EndedRank> ended;
      bool read_others = false;
      try {
        // The ended key before the others' beats: a rank that ended wrote its last beat before its launcher
        // reported it, so what is read next is its last word (a mismatch it published, its failure).
        if (look)
          if (const auto v = own->try_get(ended_key))
            if ((ended = EndedRank::decode(std::string(v->begin(), v->end()))) && (ended->rank == b->rank || ended->rank >= b->size))
              ended.reset();
        if (full) {
          // Whether the beat key still holds what this rank last wrote: a foreign writer is reported, even when
          // nobody reads the key before it is written again.
          if (!written.empty()) own->holds(b->key("beat", b->rank), written);
          const std::string beat = std::to_string(++beats) + " " + (fail ? "1" : "0") + "\n" + published;
          written = own->set_volatile(b->key("beat", b->rank), bytes(beat));
          own->repair();
        }
        if (watch && (full || ended)) {
          read_others = true;
          seen.resize(std::size_t(b->size));
          for (int r = 0; r < b->size; ++r) {
            if (r == b->rank) continue;
            auto& p = seen[std::size_t(r)];
            if (const auto v = own->try_get(b->key("beat", r))) {
              std::istringstream in(std::string(v->begin(), v->end()));
              int failed = 0;
              if (in >> p.beats >> failed) {
                p.failed = failed != 0;
                std::string rest;
                std::getline(in, rest);  // the end of the first line
                std::getline(in, rest);
                p.published = decode(rest);
              } else {
                p.beats = -1;
              }
            }
          }
        }
      } catch (const std::exception&) {
        lock.lock();
        break;  // the store is gone: the waiting thread sees `last_ok` age
      }
      lock.lock();
      const auto now = Clock::now();
      if (full) {
        b->last_ok = now;
        b->published = issued;
        if (fail) b->failed_written = true;
        b->next_beat = now + b->opt.heartbeat_interval;
      }
      const bool found = ended.has_value();
      if (found) b->ended = std::move(ended), b->ended_seen = now;
      if (read_others) {
        for (int r = 0; r < b->size; ++r) {
          if (r == b->rank) continue;
          auto& p = b->peers[std::size_t(r)];
          auto& s = seen[std::size_t(r)];
          if (s.beats < 0) {  // not written yet, or not authentic: what was known stands
            if (p.epoch != epoch) p.changed = now, p.epoch = epoch;
            continue;
          }
          if (p.epoch != epoch || p.beats != s.beats) p.changed = now;
          p.beats = s.beats, p.epoch = epoch, p.published = std::move(s.published), p.failed = s.failed;
        }
        ++b->rounds;
      }
      if (read_others || found) b->cv.notify_all();
      // Sleep until the next beat, or a quick look while someone waits and no rank is known to have ended; less
      // when someone starts watching or waiting, fails, or stops us.
      const std::uint64_t e = b->epoch;
      const bool hurried = b->waiters > 0 && !b->ended;
      const auto until = hurried ? std::min(b->next_beat, now + step) : b->next_beat;
      step = hurried ? std::min(step * 2, b->opt.quick_look()) : first_look;
      b->cv.wait_until(lock, until, [&] {
        return b->stop || b->epoch != e || (b->failed && !b->failed_written) || (!hurried && b->waiters > 0 && !b->ended);
      });
      if (b->epoch != e) step = first_look;  // a census, or a watch, begins: look soon again
      // A beat when it is due, or when someone starts watching or fails; a quick look otherwise.
      full = Clock::now() >= b->next_beat || b->stop || b->epoch != e || (b->failed && !b->failed_written);
    }
    b->exited = true;
    b->cv.notify_all();
  }
};

}  // namespace rendezvous_detail

}  // namespace accel::comm
