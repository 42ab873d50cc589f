#pragma once
//! \file
//! `Communicator`: the collectives accel needs, as an interface over a real engine: c10d Gloo on the CPU
//! (`comm/gloo.hpp`), NCCL on GPUs (`cuda/nccl.hpp`), with a timeout on every operation and errors that say
//! which rank, which operation and which peer. This header needs only ATen's `Tensor`: code that passes tensors
//! to a communicator (the collectives, the loaders, the models) does not see c10d; the engines do.
//!
//! Note [Dead peers]: every process runs a heartbeat (a counter in the rendezvous store, bumped twice a
//! second on a connection of its own; `state/rendezvous/rendezvous.hpp`). When a collective fails, the survivor takes a
//! census of the heartbeats and names the ranks that stopped (three heartbeats apart); if the store itself is
//! gone, its host is the one that died. So a dead peer ends every survivor with an error such as
//!   accel: rank 0: all_reduce(sum) of 4 x Float (collective #12) failed: Connection closed by peer. Not responding:
//!   rank 2.
//! Under a launcher that reports the processes that end (accel-launch: Note [Ended ranks] in
//! state/rendezvous/job_identity.hpp), a rank killed by a signal is named from that report at once, not after three
//! heartbeats, and a collective that waits for it is abandoned within a quick look or two
//! (`CommOptions::quick_look()`, 50 ms) even where the engine sees no connection close (a child process holds
//! the dead rank's sockets; NCCL):
//!   ... failed: Connection closed by peer. not responding: rank 2; its launcher reports that it was killed by signal 9
//!   (Killed).
//!
//! Note [Frozen peers]: a peer that stops without dying (SIGSTOP, a deadlock, a stuck file system, a hung
//! driver) keeps its connections open, so the engine would wait for the whole collective timeout. A collective
//! that has not completed within a second is therefore *watched*: the heartbeat also reads the summary that rank 0
//! gathers of every rank's counter (Note [The heartbeat at scale] in state/rendezvous/heartbeat.hpp), and a rank whose
//! counter has not moved for `CommOptions::peer_timeout` (30 s by default) ends the wait with an error naming it. A
//! process busy in a long computation keeps beating (the heartbeat is a thread of its own) and is never reported; its
//! peers simply wait, up to `CommOptions::timeout`.
//!
//! Note [Mismatched collectives]: every rank must issue the same collectives in the same order. Each collective
//! is identified by its number, kind, reduction, dtype, element count and root (`CollectiveId`), and the engine
//! carries a 32-bit fingerprint of it *with the data*: a pair of slots (bit, 1 - bit) per bit after the payload
//! (in an all-reduce they add up to (N, 0) or (0, N) when every rank agrees, and to something else when one
//! does not; an all-gather, broadcast or scatter brings each sender's bits). Payloads over 1 MiB are preceded by a
//! 64-slot check of their own instead, which costs one small collective where a copy would cost more. A mismatch never
//! returns mixed data: every rank stops with a `CollectiveMismatch` naming this rank's operation and the others' (the
//! heartbeat publishes each rank's last collectives), e.g.
//!   accel: rank 1: collective mismatch at collective #40: this rank issued all_gather of 12 x Float; rank 0
//!   issued all_reduce(sum) of 4354 x Float. ...
//! A mismatch that makes the engine hang (different kinds) is found by the watch; one the engine refuses (Gloo
//! aborts the process whose buffer is too small) is named by that process's last heartbeat. An all-reduce or a
//! broadcast of one or two elements carries no check of its own (Gloo's fast path: its check would cost more
//! than the data); its fingerprint travels with the next collective that carries one, which names it.

#include <accel/comm/collective_id.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

//! The `Communicator` interface, its engines' declarations and what every rank must agree on per collective.
namespace accel::comm {

//! The collectives of one process group. Shared, not copied; one engine implements it per `dist` tag.
class Communicator {
 public:
  //! This rank among `size`, with the timeouts and checks of `opt`; `monitor` (the rendezvous) watches the peers.
  Communicator(int rank, int size, CommOptions opt, Monitor* monitor = nullptr)
      : rank_(rank), size_(size), opt_(opt), monitor_(monitor) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  //! This process's rank in the group.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  //! The number of ranks in the group.
  [[nodiscard]] int size() const noexcept { return size_; }
  //! Where tensors must be for this engine (the CPU for Gloo, the process's GPU for NCCL).
  [[nodiscard]] virtual c10::Device device() const { return c10::Device(c10::kCPU); }
  //! The timeouts and checks this group runs with.
  [[nodiscard]] const CommOptions& options() const noexcept { return opt_; }
  //! Number of collectives issued so far (error messages quote it).
  [[nodiscard]] std::uint64_t sequence() const noexcept { return seq_; }
  //! Whether a collective failed: the group is unusable, every later call fails at once.
  [[nodiscard]] bool broken() const noexcept { return broken_; }

  //! A collective in flight (`all_reduce_start`, `reduce_start`, `all_gather_into_start`); `finish` waits for it
  //! with the timeout.
  struct Pending {
    std::uint64_t sequence = 0;    //!< the collective's number
    std::shared_ptr<void> native;  //!< the engine's own handle (Gloo: the c10d work; NCCL: the completion event)
  };
  //! Elements an all-reduce (sum) of `numel` elements of `dtype` needs after its data for the collective check
  //! (0: unchecked). A caller that reserves them (`all_reduce_start(buffer, numel)`) saves a copy.
  [[nodiscard]] virtual std::int64_t check_room(c10::ScalarType, std::int64_t) const { return 0; }
  //! Starts a sum all-reduce of `t` in place and returns at once (overlaps with the caller's work); the caller
  //! keeps `t` alive until `finish`.
  virtual Pending all_reduce_start(at::Tensor& t) = 0;
  //! The same on the first `payload` elements of the 1-d `buffer`, whose remaining `check_room(dtype, payload)`
  //! elements the engine uses for the collective check.
  virtual Pending all_reduce_start(at::Tensor& buffer, std::int64_t payload) {
    at::Tensor data = buffer.narrow(0, 0, payload);
    return all_reduce_start(data);
  }
  //! Waits for a collective started by `all_reduce_start`, `reduce_start` or `all_gather_into_start` (nothing for
  //! one already finished: `native` empty).
  virtual void finish(Pending& p) = 0;
  //! In place: every rank ends with the reduction of every rank's `t`.
  virtual void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  //! In place: every rank ends with `root`'s `t` (shapes and dtypes must already agree).
  virtual void broadcast(at::Tensor& t, int root = 0) = 0;
  //! Every rank's `t`, in rank order (shapes and dtypes must agree).
  virtual std::vector<at::Tensor> all_gather(const at::Tensor& t) = 0;
  //! `root` sends `chunks[r]` to rank r (all chunks the same shape); every rank receives into `out`.
  virtual void scatter(at::Tensor& out, const std::vector<at::Tensor>& chunks, int root = 0) = 0;
  //! Returns when every rank has called it.
  virtual void barrier() = 0;

  // ---- the sharding collectives (ZeRO: optim/sharded.hpp) ----------------------------------------------------

  //! Sum over ranks of the 1-d `input` (N equal parts, N = size()), rank r keeping part r in `out` (1-d,
  //! `input.numel() / N` elements). The base class falls back to an all-reduce of the whole input (N times the
  //! traffic of a native reduce-scatter); Gloo and NCCL override it with their native operation.
  virtual void reduce_scatter(at::Tensor& out, const at::Tensor& input) {
    check_parts(out, input, "reduce_scatter");
    at::Tensor all = input.contiguous().clone();
    all_reduce(all, ReduceOp::sum);
    out.copy_(all.narrow(0, std::int64_t(rank_) * out.numel(), out.numel()));
  }
  //! Starts a sum reduce of the first `payload` elements of the 1-d `buffer` to `root` and returns at once
  //! (`finish` waits): `root`'s buffer ends with the sum, the others' are scratch. The remaining
  //! `check_room(dtype, payload)` elements are the engine's, as in `all_reduce_start`. ZeRO stage 2 sends each
  //! gradient bucket to the rank that owns it this way. The base class falls back to an all-reduce (N times
  //! the traffic at the root's end); Gloo and NCCL override it with their native reduce.
  virtual Pending reduce_start(at::Tensor& buffer, std::int64_t payload, int root) {
    check_root(root, "reduce");
    return all_reduce_start(buffer, payload);
  }
  //! Every rank's 1-d `part`, in rank order, into the 1-d `out` (N times `part.numel()` elements; `part` may be
  //! a view of `out`'s own slice). The base class falls back to `all_gather` and a copy.
  virtual void all_gather_into(at::Tensor& out, const at::Tensor& part) {
    check_parts(part, out, "all_gather_into");
    const auto parts = all_gather(part.contiguous());
    for (int r = 0; r < size_; ++r)
      if (r != rank_)
        out.narrow(0, std::int64_t(r) * part.numel(), part.numel()).copy_(parts[std::size_t(r)].reshape({-1}));
  }
  //! Starts `all_gather_into(out, part)` and returns at once (full sharding's prefetch of the next unit overlaps
  //! the caller's compute this way); `finish` waits for it, with the timeout and the checks of a blocking one, and
  //! only then may `out` be read or freed. The caller keeps `part` unchanged until `finish`. The base class runs
  //! the blocking one (nothing is left for `finish`); Gloo and NCCL run it in the background.
  virtual Pending all_gather_into_start(at::Tensor& out, const at::Tensor& part) {
    all_gather_into(out, part);
    return {seq_, nullptr};
  }
  //! In place: every rank ends with `root`'s `tensors` (shapes and dtypes must already agree), in one collective:
  //! their bytes packed into one buffer (PyTorch's `_broadcast_coalesced`), so any mix of dtypes travels at once.
  virtual void broadcast_coalesced(std::vector<at::Tensor>& tensors, int root = 0) {
    std::int64_t bytes = 0;
    for (const auto& t : tensors) bytes += t.numel() * std::int64_t(t.element_size());
    if (bytes == 0) return;
    const c10::Device where = tensors.front().device();
    at::Tensor packed = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(where));
    if (rank_ == root) pack(tensors, packed);
    broadcast(packed, root);
    if (rank_ != root) {
      std::int64_t at = 0;
      for (auto& t : tensors) {
        const std::int64_t n = t.numel() * std::int64_t(t.element_size());
        if (n == 0) continue;
        at::Tensor dst = t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
        dst.view({-1}).view(at::kByte).copy_(packed.narrow(0, at, n));
        if (!dst.is_same(t)) t.copy_(dst);
        at += n;
      }
    }
  }

 protected:
  //! Numbers the next collective and tells the heartbeat about it; refuses to start on a broken group.
  CollectiveId begin(OpKind kind, c10::ScalarType dtype, std::int64_t numel, ReduceOp reduce = ReduceOp::sum,
                     int root = 0) {
    CollectiveId id{++seq_, kind, reduce, dtype, numel, root};
    if (broken_)
      throw CommunicationError("accel: rank " + std::to_string(rank_) + ": " + id.describe() + " (collective #" +
                               std::to_string(id.seq) +
                               ") after an earlier collective failed: the process group is "
                               "unusable; end the process (accel-launch --max-restarts restarts the job)");
    if (monitor_) monitor_->issued(id);
    return id;
  }

  //! Waits for `id`: `done(slice)` waits up to `slice` and says whether the collective completed (throwing
  //! the engine's error). A collective that waits longer than a quick look is abandoned as soon as a launcher
  //! reports a rank that ended (Note [Ended ranks]), and one that takes longer than a second is watched (Note
  //! [Frozen peers]).
  template <class Done>
  void await(const CollectiveId& id, Done&& done) {
    const auto t0 = Clock::now();
    const auto quick = opt_.quick_look();
    if (done(std::min(opt_.timeout, quick))) return;
    std::shared_ptr<void> waiting = monitor_ ? monitor_->waiting() : nullptr, watching;
    for (;;) {
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
      if (waited >= opt_.timeout) fail(id, "timed out after " + seconds(waited));
      if (done(std::min(opt_.timeout - waited, quick))) return;
      if (!monitor_) continue;
      waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
      if (!watching && waited >= std::chrono::seconds(1)) watching = monitor_->watch();
      if (const Finding f = watching ? monitor_->verdict(id) : monitor_->ended()) fail_found(id, f, waited);
    }
  }
  //! Ends a watched wait for `id` with what the heartbeat found (after `waited`).
  [[noreturn]] void fail_found(const CollectiveId& id, const Finding& f, std::chrono::milliseconds waited) {
    if (f.kind == Finding::Kind::mismatch) fail_mismatch(id, f.text);
    // A rank that ended: the census names it (and a mismatch it published before it ended).
    if (f.kind == Finding::Kind::ended) fail(id, "abandoned after " + seconds(waited) + ": a process of the job ended");
    // A peer that failed: its error says why; the census names the ranks that stopped.
    fail(id, "waited " + seconds(waited) + ": " + f.text, /*census=*/f.kind == Finding::Kind::failed);
  }

  //! Throws the CommunicationError for `id`, with the census of the other ranks; the group is broken after.
  [[noreturn]] void fail(const CollectiveId& id, std::string msg, bool census = true) {
    broken_ = true;
    if (const auto cut = msg.find('\n'); cut != std::string::npos) msg.resize(cut);  // drop c10's backtraces
    std::string tail;
    if (census && monitor_) {
      const Finding f = monitor_->census(&id);
      if (f.kind == Finding::Kind::mismatch) fail_mismatch(id, f.text);
      tail = f.text;
    }
    throw CommunicationError("accel: rank " + std::to_string(rank_) + ": " + id.describe() + " (collective #" +
                             std::to_string(id.seq) + ", timeout " + std::to_string(opt_.timeout.count()) +
                             " ms) failed: " + msg + (tail.empty() ? "" : ". " + tail) + ".");
  }
  //! Throws the CollectiveMismatch for `id`; `others` names what the other ranks issued.
  [[noreturn]] void fail_mismatch(const CollectiveId& id, const std::string& others) {
    broken_ = true;
    if (monitor_) monitor_->failed();  // a peer still waiting (a broadcast's root) stops too
    throw CollectiveMismatch("accel: rank " + std::to_string(rank_) + ": collective mismatch at collective #" +
                             std::to_string(id.seq) + ": this rank issued " + id.describe() + "; " + others +
                             ". Every rank must issue the same collectives in the same order: look for a collective "
                             "under a condition on the rank, or loops of different lengths on different ranks (uneven "
                             "inputs are joined by accel's loaders; a loop of your own is not)");
  }
  //! A mismatch the engine's data revealed, at `id` or at one of the unchecked collectives before it: names
  //! the first collective where another rank's operation differs, from what the heartbeats published (waiting
  //! up to five heartbeats for them).
  [[noreturn]] void mismatch_found(const CollectiveId& id, const std::vector<int>& suspects) {
    // The collectives that may differ: `id`, and the unchecked ones before it that this rank still remembers.
    const std::uint64_t first = id.unchecked_from ? id.unchecked_from : id.seq;
    CollectiveId at = id;
    std::string others;
    if (monitor_) {
      auto watching = monitor_->watch();
      const auto t0 = Clock::now();
      for (;;) {
        for (std::uint64_t s = first; s <= id.seq && others.empty(); ++s)
          if (const auto own = monitor_->own(s)) {
            others = monitor_->differing(*own);
            if (!others.empty()) at = *own;
          }
        // Five heartbeats: the other rank's beat, rank 0's summary of it and this rank's read of that (Note [The
        // heartbeat at scale] in state/rendezvous/heartbeat.hpp) take up to one each.
        if (!others.empty() || Clock::now() - t0 > opt_.heartbeat_interval * 5) break;
        std::this_thread::sleep_for(opt_.heartbeat_interval / 2);
      }
    }
    if (others.empty()) {
      std::string who;
      for (int r : suspects) who += (who.empty() ? "" : ", ") + std::to_string(r);
      others = who.empty() ? "another rank issued a different collective"
                           : "rank(s) " + who + " issued a different collective";
      if (first < id.seq)
        others += " (here or in one of collectives #" + std::to_string(first) + "-#" + std::to_string(id.seq - 1) + ")";
    }
    fail_mismatch(at, others);
  }
  //! Takes the unchecked collectives' fingerprints into `id` (it carries a check).
  void carry_unchecked(CollectiveId& id) noexcept {
    id.unchecked = unchecked_, id.unchecked_from = unchecked_from_;
    unchecked_ = 0, unchecked_from_ = 0;
  }
  //! `id` carries no check: the next collective that does checks it too.
  void leave_unchecked(const CollectiveId& id) noexcept {
    unchecked_ = unchecked_ * 16777619u ^ id.fingerprint();
    if (!unchecked_from_) unchecked_from_ = id.seq;
  }

  // ---- the fingerprint slots (Note [Mismatched collectives]) ------------------------------------------------

  //! Slots a check of `dtype` needs: 64, a pair (bit, 1 - bit) per bit of the fingerprint (a sum gives (N, 0) or
  //! (0, N) when every rank agrees, a max or min (1, 0) or (0, 1): the same room for every reduction, so a sum and a
  //! max of the same data stay the same size); 0 where the dtype cannot count to N exactly (bool, complex, bf16
  //! beyond 256 ranks, ...).
  [[nodiscard]] std::int64_t slots(c10::ScalarType dtype) const {
    if (!opt_.check_collectives) return 0;
    std::int64_t exact = 0;  // the largest count the dtype holds exactly
    switch (dtype) {
      case c10::ScalarType::Float:
        exact = std::int64_t(1) << 24;
        break;
      case c10::ScalarType::Double:
      case c10::ScalarType::Long:
      case c10::ScalarType::Int:
        exact = std::int64_t(1) << 31;
        break;
      case c10::ScalarType::Half:
        exact = 2048;
        break;
      case c10::ScalarType::BFloat16:
        exact = 256;
        break;
      case c10::ScalarType::Short:
        exact = 32767;
        break;
      case c10::ScalarType::Char:
        exact = 127;
        break;
      case c10::ScalarType::Byte:
        exact = 255;
        break;
      default:
        return 0;
    }
    return size_ > exact ? 0 : 64;
  }
  //! Writes this rank's fingerprint of `id` into `s` (a CPU 1-d tensor of `slots(...)` elements).
  static void write_check(at::Tensor s, const CollectiveId& id) {
    const std::uint32_t f = id.fingerprint();
    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, s.scalar_type(), "accel_write_check", [&] {
      auto* p = s.data_ptr<scalar_t>();
      for (int b = 0; b < 32; ++b) {
        const int bit = int((f >> b) & 1u);
        p[2 * b] = scalar_t(bit), p[2 * b + 1] = scalar_t(1 - bit);
      }
    });
  }
  //! Whether the slots `s` that came back say that every rank issued `id`: each pair holds `copies` times this
  //! rank's bits (a sum: N copies; a max, a min or a sender's own slots: 1).
  static bool read_check(const at::Tensor& s, const CollectiveId& id, int copies) {
    const std::uint32_t f = id.fingerprint();
    bool ok = true;
    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, s.scalar_type(), "accel_read_check", [&] {
      const auto* p = s.data_ptr<scalar_t>();
      for (int b = 0; b < 32 && ok; ++b) {
        const double bit = double((f >> b) & 1u);
        ok = double(p[2 * b]) == bit * copies && double(p[2 * b + 1]) == (1 - bit) * copies;
      }
    });
    return ok;
  }

  //! `part` is one of N equal parts of the 1-d `whole` (same dtype and device).
  void check_parts(const at::Tensor& part, const at::Tensor& whole, const char* op) const {
    detail::require(part.dim() == 1 && whole.dim() == 1 && whole.numel() == part.numel() * size_ &&
                        part.scalar_type() == whole.scalar_type() && part.device() == whole.device(),
                    std::string("accel: ") + op + ": the whole must be 1-d with N = " + std::to_string(size_) +
                        " times the part's elements, of the same dtype and device (got a part of " +
                        std::to_string(part.numel()) + " x " + c10::toString(part.scalar_type()) + " and a whole of " +
                        std::to_string(whole.numel()) + " x " + c10::toString(whole.scalar_type()) +
                        "); pad the whole to a multiple of N");
  }
  //! The bytes of `tensors`, one after the other, into the byte tensor `packed`.
  static void pack(const std::vector<at::Tensor>& tensors, at::Tensor& packed) {
    std::int64_t at = 0;
    for (const auto& t : tensors) {
      const std::int64_t n = t.numel() * std::int64_t(t.element_size());
      if (n == 0) continue;
      packed.narrow(0, at, n).copy_(t.contiguous().view({-1}).view(at::kByte));
      at += n;
    }
  }
  //! Who watches the peers (the rendezvous's heartbeat); null: nobody.
  [[nodiscard]] Monitor* monitor() const noexcept { return monitor_; }
  //! Refuses a root outside the group's ranks, naming the operation.
  void check_root(int root, const char* op) const {
    detail::require(root >= 0 && root < size_, "accel: " + std::string(op) + " from rank " + std::to_string(root) +
                                                   ", but the job has ranks 0.." + std::to_string(size_ - 1));
  }
  //! A duration as "12.3 s", for messages.
  static std::string seconds(std::chrono::milliseconds ms) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f s", double(ms.count()) / 1000.0);
    return buf;
  }

 private:
  int rank_, size_;
  CommOptions opt_;
  Monitor* monitor_ = nullptr;
  std::uint64_t seq_ = 0;
  bool broken_ = false;
  std::uint32_t unchecked_ = 0;  // fingerprints of the collectives since the last checked one
  std::uint64_t unchecked_from_ = 0;
};

}  // namespace accel::comm
