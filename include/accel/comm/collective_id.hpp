#pragma once
//! \file
//! What every rank must agree on about a collective (`CollectiveId`: number, kind, reduction, dtype, count, root,
//! and its fingerprint), what the heartbeat finds when one waits too long (`Finding`, `Monitor`: Notes [Frozen
//! peers] and [Mismatched collectives] in comm/communicator.hpp), and a communicator's options (`CommOptions`).

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace accel::comm {

//! A reduction of the collectives (`Reduction::mean` is a sum divided afterwards).
enum class ReduceOp { sum, max, min };

//! Timeouts, the peer watch and the collective check (the runtime knobs of the distributed slot).
struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};             //!< every collective
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};  //!< waiting for every process to arrive
  std::chrono::milliseconds heartbeat_interval{500};                      //!< each rank's heartbeat period
  //! A peer whose heartbeat has not moved for this long while this rank waits for it is reported as frozen
  //! (Note [Frozen peers]); keep it well above `heartbeat_interval`.
  std::chrono::milliseconds peer_timeout{std::chrono::seconds(30)};
  //! Check that every rank issues the same collective (Note [Mismatched collectives]).
  bool check_collectives = true;

  //! How often a collective that waits looks for a rank that ended (Note [Ended ranks] in
  //! state/rendezvous/job_identity.hpp), and how long it waits before it starts to: a tenth of the heartbeat, at least
  //! 5 ms.
  [[nodiscard]] std::chrono::milliseconds quick_look() const {
    return std::max(heartbeat_interval / 10, std::chrono::milliseconds(5));
  }
};

//! The clock of timeouts and heartbeats.
using Clock = std::chrono::steady_clock;

//! The kind of a collective.
enum class OpKind : std::uint8_t { all_reduce, broadcast, all_gather, scatter, barrier, reduce_scatter, reduce };

//! One collective as every rank must agree on it: its number in the job, kind, reduction, dtype, element
//! count (per rank) and root.
struct CollectiveId {
  std::uint64_t seq = 0;                           //!< its number in the job
  OpKind kind = OpKind::barrier;                   //!< which collective
  ReduceOp reduce = ReduceOp::sum;                 //!< the reduction (reducing kinds)
  c10::ScalarType dtype = c10::ScalarType::Float;  //!< the element type
  std::int64_t numel = 0;                          //!< elements per rank
  int root = 0;                                    //!< the root (broadcast, scatter, reduce)
  //! The fingerprints of the collectives before this one that carried no check (an all-reduce of one or two
  //! elements: Gloo's fast path), mixed in, and the first of them (0: none). A mismatch there is found here.
  std::uint32_t unchecked = 0;
  std::uint64_t unchecked_from = 0;  //!< the first collective `unchecked` covers (0: none)

  //! The same operation (what every rank must agree on).
  friend bool operator==(const CollectiveId& a, const CollectiveId& b) {
    return a.seq == b.seq && a.kind == b.kind && a.reduce == b.reduce && a.dtype == b.dtype && a.numel == b.numel &&
           a.root == b.root;
  }

  //! "all_reduce(sum) of 4 x Float", "broadcast from rank 0 of 12 x Long", "barrier".
  [[nodiscard]] std::string describe() const {
    static constexpr const char* kinds[] = {"all_reduce", "broadcast",      "all_gather", "scatter",
                                            "barrier",    "reduce_scatter", "reduce"};
    static constexpr const char* ops[] = {"sum", "max", "min"};
    std::string out = kinds[int(kind)];
    if (kind == OpKind::barrier) return out;
    if (kind == OpKind::all_reduce || kind == OpKind::reduce_scatter || kind == OpKind::reduce)
      out += std::string("(") + ops[int(reduce)] + ")";
    if (kind == OpKind::broadcast || kind == OpKind::scatter) out += " from rank " + std::to_string(root);
    if (kind == OpKind::reduce) out += " to rank " + std::to_string(root);
    return out + " of " + std::to_string(numel) + " x " + c10::toString(dtype);
  }
  //! 32 bits of every field (FNV-1a), and of the unchecked collectives before it: what travels with the data.
  [[nodiscard]] std::uint32_t fingerprint() const {
    std::uint64_t h = 14695981039346656037ull;
    auto mix = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    };
    mix(seq), mix(std::uint64_t(kind)), mix(std::uint64_t(reduce)), mix(std::uint64_t(dtype)),
        mix(std::uint64_t(numel)), mix(std::uint64_t(root)), mix(unchecked);
    return std::uint32_t(h ^ (h >> 32));
  }
  //! "seq kind reduce dtype numel root": what the heartbeat publishes.
  [[nodiscard]] std::string encode() const {
    return std::to_string(seq) + " " + std::to_string(int(kind)) + " " + std::to_string(int(reduce)) + " " +
           std::to_string(int(dtype)) + " " + std::to_string(numel) + " " + std::to_string(root);
  }
  //! Parses `encode()`'s text; none if it is not one.
  [[nodiscard]] static std::optional<CollectiveId> decode(const std::string& s) {
    std::istringstream in(s);
    CollectiveId id;
    int kind = 0, reduce = 0, dtype = 0;
    if (!(in >> id.seq >> kind >> reduce >> dtype >> id.numel >> id.root)) return std::nullopt;
    if (kind < 0 || kind > int(OpKind::reduce) || reduce < 0 || reduce > 2 || dtype < 0 ||
        dtype >= int(c10::ScalarType::NumOptions))
      return std::nullopt;
    id.kind = OpKind(kind), id.reduce = ReduceOp(reduce), id.dtype = c10::ScalarType(dtype);
    return id;
  }
};

//! What the heartbeat found about the other ranks: nothing (keep waiting), a collective mismatch, a rank that
//! reported its own failure, ranks that stopped responding, or a rank that ended (its launcher says so: Note
//! [Ended ranks]); `text` says it for an error message.
struct Finding {
  //! Nothing, a mismatch, a failure a rank reported, silent ranks, or a rank that ended.
  enum class Kind { none, mismatch, failed, silent, ended };
  Kind kind = Kind::none;  //!< what was found
  std::string text;        //!< the finding, for an error message
  //! Whether something was found.
  explicit operator bool() const noexcept { return kind != Kind::none; }
};

//! What the heartbeat knows of the other ranks; the rendezvous implements it (Notes [Dead peers],
//! [Frozen peers], [Mismatched collectives]). Every method is bounded in time: none waits on a peer.
class Monitor {
 public:
  virtual ~Monitor() = default;
  //! Records the collective this rank issues; the next heartbeat publishes it. Cheap (a lock and a copy).
  virtual void issued(const CollectiveId& id) noexcept = 0;
  //! The collective this rank issued as number `seq`, while it is among the last ones recorded.
  [[nodiscard]] virtual std::optional<CollectiveId> own(std::uint64_t seq) const = 0;
  //! While the result (never null) lives, the heartbeat also reads what rank 0 gathers of every rank's counter and
  //! collectives (Note [The heartbeat at scale] in state/rendezvous/heartbeat.hpp).
  [[nodiscard]] virtual std::shared_ptr<void> watch() = 0;
  //! While the result (never null) lives, the heartbeat looks for a rank that ended every
  //! `CommOptions::quick_look()` instead of every beat (a collective that waits; a census).
  [[nodiscard]] virtual std::shared_ptr<void> waiting() = 0;
  //! A rank of the job that ended, as its launcher reported it (Note [Ended ranks]), or nothing. Never blocks.
  [[nodiscard]] virtual Finding ended() const = 0;
  //! Which other ranks published another operation under `own`'s number ("rank 1 issued ..."; empty: none known).
  [[nodiscard]] virtual std::string differing(const CollectiveId& own) const = 0;
  //! A reason to stop waiting for `id` now (a rank that issued another collective under its number, a rank that
  //! failed, a rank silent for `peer_timeout`, an unreachable store, a rank that ended), or nothing: keep
  //! waiting. Meaningful while a `watch` lives. Never blocks.
  [[nodiscard]] virtual Finding verdict(const CollectiveId& id) const = 0;
  //! After a failure: records that this rank failed, then names the ranks that stopped responding and, for
  //! `id`, the ranks that issued something else. Takes a few heartbeat intervals; never throws.
  [[nodiscard]] virtual Finding census(const CollectiveId* id) noexcept = 0;
  //! Records that this rank failed (the next heartbeat publishes it; the others' watch stops waiting for it).
  virtual void failed() noexcept = 0;
};

}  // namespace accel::comm
