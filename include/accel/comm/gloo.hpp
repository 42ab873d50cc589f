#pragma once
//! \file
//! The CPU engine: `GlooCommunicator`, the collectives over c10d `ProcessGroupGloo` and accel's rendezvous store
//! (what `torchrun` + Accelerate use for MULTI_CPU). Kept apart because `ProcessGroupGloo.hpp` costs ~10 s per
//! translation unit; only `state/impl/engine.ipp` includes it (with the definitions of state/engine.hpp).

#include <accel/comm/communicator.hpp>
#include <accel/comm/connect.hpp>
#include <accel/state/rendezvous/rendezvous.hpp>

#include <ATen/ops/add.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace accel::comm {

// Note [Point-to-point all-gather and reduce-scatter]: c10d Gloo's all-gather and reduce-scatter go through a
// flat buffer they allocate per call (copied into and out of) and send one message per step of their algorithm: on
// loopback, between 2 processes, an all-gather into 26 MB takes 28 ms and a reduce-scatter of 26 MB 32-35 ms, while
// an all-reduce of the same 26 MB (twice the bytes each rank sends) takes 21 ms. The large ones (those preceded by a
// check collective of their own, Note [Mismatched collectives]) therefore travel as point-to-point messages, all
// posted at once and moved by Gloo's device thread: in an all-gather each rank sends its part to every other rank,
// straight from the part and into its place in the output (10 ms for the same 26 MB); in a reduce-scatter each rank
// sends every other rank that rank's slice of its input and sums the N slices it receives, in rank order (12-16 ms).
// Each rank sends the bytes the ring algorithms send, with N - 1 messages in flight. The check collective before the
// messages has made every rank agree on the operation, so each message has its match (with the check turned off,
// `CommOptions::check_collectives`, ranks that disagree fail in Gloo instead); they are tagged with the collective's
// number. A Gloo send or receive cannot be polled (a wait that times out breaks the whole context):
// a waiter thread waits for them (`Exchange`), and `finish` waits for that thread as for every collective
// (Communicator::await: watched after a second, bounded by the timeout); after a failure the messages still posted
// are aborted and their buffers left alive (the process group is unusable; the process ends soon).

//! The collectives of `Communicator` on a c10d backend (Gloo), every one watched and checked (Notes [Frozen
//! peers] and [Mismatched collectives] in communicator.hpp).
class GlooCommunicator final : public Communicator {
  //! Payloads above this many bytes get a check collective of their own instead of a copy with the slots.
  static constexpr std::int64_t kFramedBytes = std::int64_t(1) << 20;

 public:
  //! Takes the rendezvous (kept: its heartbeat watches the peers) and the c10d Gloo backend built on its store.
  GlooCommunicator(std::unique_ptr<rendezvous::Rendezvous> rdzv, c10::intrusive_ptr<c10d::Backend> backend, int rank,
                   int size, CommOptions opt)
      : Communicator(rank, size, opt, rdzv.get()), rdzv_(std::move(rdzv)), backend_(std::move(backend)) {}
  ~GlooCommunicator() override {
    // After a failure a Gloo worker may still wait on a frozen peer, and destroying the group would join it:
    // leave the group behind (the process is ending).
    if (broken()) backend_.release();
  }

  //! The c10d process group (for raw calls beside accel's, e.g. a benchmark's baseline).
  [[nodiscard]] const c10::intrusive_ptr<c10d::Backend>& backend() const noexcept { return backend_; }
  //! The rendezvous this group met through.
  [[nodiscard]] const rendezvous::Rendezvous& rendezvous() const noexcept { return *rdzv_; }

  [[nodiscard]] std::int64_t check_room(c10::ScalarType dtype, std::int64_t numel) const override {
    return framed_all_reduce(numel) ? slots(dtype) : 0;
  }

  Pending all_reduce_start(at::Tensor& t) override {
    const std::int64_t room = check_room(t.scalar_type(), t.numel());
    if (room == 0 && t.dim() == 1 && t.is_contiguous()) return all_reduce_start(t, t.numel());
    // A copy with room for the check, copied back by `finish`.
    at::Tensor buffer = at::empty({t.numel() + room}, t.options());
    buffer.narrow(0, 0, t.numel()).copy_(t.reshape({-1}));
    Pending p = all_reduce_start(buffer, t.numel());
    std::static_pointer_cast<InFlight>(p.native)->copy_back = t;
    return p;
  }
  Pending all_reduce_start(at::Tensor& buffer, std::int64_t payload) override {
    return start(OpKind::all_reduce, buffer, payload, 0, [&](std::vector<at::Tensor>& v) {
      c10d::AllreduceOptions o;
      o.timeout = options().timeout;
      return backend_->allreduce(v, o);
    });
  }
  //! Gloo's native reduce (c10d `reduce`), checked at the root as an all-reduce is (its slots sum N copies).
  Pending reduce_start(at::Tensor& buffer, std::int64_t payload, int root) override {
    check_root(root, "reduce");
    return start(OpKind::reduce, buffer, payload, root, [&](std::vector<at::Tensor>& v) {
      c10d::ReduceOptions o;
      o.rootRank = root;
      o.timeout = options().timeout;
      return backend_->reduce(v, o);
    });
  }
  void finish(Pending& p) override {
    if (!p.native) return;
    auto f = std::static_pointer_cast<InFlight>(std::move(p.native));
    if (f->exchange) {
      wait(f->id, f->exchange);
      if (f->copy_back.defined()) f->copy_back.copy_(f->buffer);  // gathered into a contiguous copy
      return;
    }
    wait(f->id, f->work);
    if (f->id.kind == OpKind::all_gather) return place_parts(*f);
    const bool result_here = f->id.kind != OpKind::reduce || f->id.root == rank();
    if (f->room && result_here && !read_check(f->buffer.narrow(0, f->payload, f->room), f->id, size()))
      mismatch_found(f->id, {});
    if (f->copy_back.defined()) f->copy_back.copy_(f->buffer.narrow(0, 0, f->payload).view(f->copy_back.sizes()));
  }
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::sum) override {
    auto id = begin(OpKind::all_reduce, t.scalar_type(), t.numel(), op);
    const std::int64_t room = check_room(t.scalar_type(), t.numel());
    c10d::AllreduceOptions o;
    o.reduceOp = op == ReduceOp::sum   ? c10d::ReduceOp::SUM
                 : op == ReduceOp::max ? c10d::ReduceOp::MAX
                                       : c10d::ReduceOp::MIN;
    o.timeout = options().timeout;
    const bool frame = framing(id, t, room);
    std::vector<at::Tensor> v{frame ? framed_copy(t, id, room) : t};
    run(id, [&] { return backend_->allreduce(v, o); });
    if (!frame) return;
    // A sum counts every rank's bits; a max or a min keeps one copy of them.
    if (!read_check(v[0].narrow(0, t.numel(), room), id, op == ReduceOp::sum ? size() : 1)) mismatch_found(id, {});
    t.copy_(v[0].narrow(0, 0, t.numel()).view(t.sizes()));
  }
  void broadcast(at::Tensor& t, int root = 0) override {
    check_root(root, "broadcast");
    auto id = begin(OpKind::broadcast, t.scalar_type(), t.numel(), ReduceOp::sum, root);
    const std::int64_t room = check_room(t.scalar_type(), t.numel());
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = options().timeout;
    const bool frame = framing(id, t, room);
    std::vector<at::Tensor> v{frame ? framed_copy(t, id, room) : t};
    run(id, [&] { return backend_->broadcast(v, o); });
    if (!frame) return;
    if (!read_check(v[0].narrow(0, t.numel(), room), id, 1)) mismatch_found(id, {root});
    if (rank() != root) t.copy_(v[0].narrow(0, 0, t.numel()).view(t.sizes()));
  }
  std::vector<at::Tensor> all_gather(const at::Tensor& t) override {
    auto id = begin(OpKind::all_gather, t.scalar_type(), t.numel());
    const std::int64_t room = slots(t.scalar_type());
    c10d::AllgatherOptions o;
    o.timeout = options().timeout;
    const bool frame = framing(id, t, room);
    std::vector<at::Tensor> in{frame ? framed_copy(t, id, room) : t.contiguous()};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size(); ++r) out[0].push_back(at::empty_like(in[0]));
    run(id, [&] { return backend_->allgather(out, in, o); });
    if (!frame) return std::move(out[0]);
    std::vector<int> differ;
    for (int r = 0; r < size(); ++r)
      if (!read_check(out[0][std::size_t(r)].narrow(0, t.numel(), room), id, 1)) differ.push_back(r);
    if (!differ.empty()) mismatch_found(id, differ);
    std::vector<at::Tensor> parts;
    for (auto& g : out[0]) parts.push_back(g.narrow(0, 0, t.numel()).view(t.sizes()));
    return parts;
  }
  void scatter(at::Tensor& out, const std::vector<at::Tensor>& chunks, int root = 0) override {
    check_root(root, "scatter");
    auto id = begin(OpKind::scatter, out.scalar_type(), out.numel(), ReduceOp::sum, root);
    const std::int64_t room = slots(out.scalar_type());
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    opts.timeout = options().timeout;
    const bool frame = framing(id, out, room);
    std::vector<at::Tensor> o{frame ? at::empty({out.numel() + room}, out.options()) : out};
    std::vector<std::vector<at::Tensor>> in;
    if (rank() == root) {
      in.emplace_back();
      for (const auto& c : chunks) in.back().push_back(frame ? framed_copy(c, id, room) : c);
    }
    run(id, [&] { return backend_->scatter(o, in, opts); });
    if (!frame) return;
    if (!read_check(o[0].narrow(0, out.numel(), room), id, 1)) mismatch_found(id, {root});
    out.copy_(o[0].narrow(0, 0, out.numel()).view(out.sizes()));
  }
  //! Gloo's native reduce-scatter (c10d `reduce_scatter` of N parts) for small payloads, which carry the
  //! fingerprint's slots after every part (the sum brings N copies of them); large ones are preceded by a check of
  //! their own and travel as point-to-point messages (Note [Point-to-point all-gather and reduce-scatter]).
  void reduce_scatter(at::Tensor& out, const at::Tensor& input) override {
    check_parts(out, input, "reduce_scatter");
    auto id = begin(OpKind::reduce_scatter, out.scalar_type(), out.numel());
    const std::int64_t n = out.numel(), room = slots(out.scalar_type());
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = options().timeout;
    const bool frame = framing(id, out, room);
    const at::Tensor whole = input.contiguous();
    if (!frame && size() > 1 && messages(out)) return reduce_scatter_messages(id, out, whole);
    std::vector<std::vector<at::Tensor>> in(1);
    for (int r = 0; r < size(); ++r) {
      const at::Tensor part = whole.narrow(0, std::int64_t(r) * n, n);
      in[0].push_back(frame ? framed_copy(part, id, room) : part.clone());
    }
    const bool direct = !frame && out.is_contiguous();
    std::vector<at::Tensor> outs{frame    ? at::empty({n + room}, out.options())
                                 : direct ? out
                                          : at::empty({n}, out.options())};
    run(id, [&] { return backend_->reduce_scatter(outs, in, o); });
    if (frame && !read_check(outs[0].narrow(0, n, room), id, size())) mismatch_found(id, {});
    if (!direct) out.copy_(outs[0].narrow(0, 0, n));
  }
  //! Gloo's native all-gather (c10d `allgather`) into the parts of `out` for small payloads, which carry the slots,
  //! as in `all_gather`, and are copied into place; large ones are preceded by a check and travel as point-to-point
  //! messages into place (Note [Point-to-point all-gather and reduce-scatter]).
  void all_gather_into(at::Tensor& out, const at::Tensor& part) override {
    Pending p = all_gather_into_start(out, part);
    finish(p);
  }
  //! The same in the background: the c10d work starts here (after the check collective of a large payload, which
  //! waits for the peers), and `finish` waits for it as for every collective (the timeout, dead and frozen peers),
  //! then checks each sender's slots and copies a small payload's parts into place.
  Pending all_gather_into_start(at::Tensor& out, const at::Tensor& part) override {
    check_parts(part, out, "all_gather_into");
    auto id = begin(OpKind::all_gather, part.scalar_type(), part.numel());
    const std::int64_t n = part.numel(), room = slots(part.scalar_type());
    c10d::AllgatherOptions o;
    o.timeout = options().timeout;
    const bool frame = framing(id, part, room);
    if (!frame && size() > 1 && messages(part)) return all_gather_messages(id, out, part);
    // Gloo reads the input while it writes the outputs: a part that aliases `out` travels as a copy.
    std::vector<at::Tensor> in{frame                   ? framed_copy(part, id, room)
                               : part.is_alias_of(out) ? part.clone()
                                                       : part.contiguous()};
    const bool direct = !frame && out.is_contiguous();
    auto f = std::make_shared<InFlight>();
    f->id = id, f->payload = n, f->room = frame ? room : 0;
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int r = 0; r < size(); ++r)
      gathered[0].push_back(direct ? out.narrow(0, std::int64_t(r) * n, n) : at::empty({n + f->room}, part.options()));
    try {
      f->work = backend_->allgather(gathered, in, o);
    } catch (const std::exception& e) {
      fail(id, e.what());
    }
    if (!direct) f->parts = std::move(gathered[0]), f->copy_back = out;
    return {id.seq, std::move(f)};
  }
  // broadcast_coalesced: the base class's packing into one native broadcast (checked as every broadcast).

  void barrier() override {
    auto id = begin(OpKind::barrier, at::kInt, 0);
    if (slots(at::kInt)) return check(id);  // the check is an all-reduce: a barrier too
    leave_unchecked(id);
    c10d::BarrierOptions o;
    o.timeout = options().timeout;
    run(id, [&] { return backend_->barrier(o); });
  }

 private:
  //! The point-to-point messages of one collective and the thread that waits for them (Note [Point-to-point
  //! all-gather and reduce-scatter]).
  class Exchange {
   public:
    explicit Exchange(const std::vector<c10::intrusive_ptr<c10d::Work>>& works) : works_(works) {
      waiter_ = std::thread([this] {
        std::exception_ptr error;
        try {
          for (auto& w : works_) w->wait();
        } catch (...) {
          error = std::current_exception();
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          done_ = true, error_ = error;
        }
        cv_.notify_all();
      });
    }
    Exchange(const Exchange&) = delete;
    Exchange& operator=(const Exchange&) = delete;
    ~Exchange() { stop(); }
    //! Whether every message completed within `slice` (rethrows the engine's error).
    bool wait_for(std::chrono::milliseconds slice) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, slice, [&] { return done_; })) return false;
      if (error_) std::rethrow_exception(error_);
      return true;
    }
    //! Aborts the messages still posted and ends the waiter.
    void stop() noexcept {
      if (!waiter_.joinable()) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!done_)
          for (auto& w : works_) try {
              w->abort();
            } catch (...) {
            }
      }
      waiter_.join();
    }

   private:
    std::vector<c10::intrusive_ptr<c10d::Work>> works_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::exception_ptr error_;
    std::thread waiter_;
  };

  struct InFlight {
    CollectiveId id;
    c10::intrusive_ptr<c10d::Work> work;
    std::shared_ptr<Exchange> exchange;  // point-to-point messages instead of `work`
    at::Tensor buffer, copy_back;        // an all-gather's: none, and its `out` unless gathered in place
    std::vector<at::Tensor> parts;  // an all-gather's outputs, unless gathered in place: each sender's part and slots
    std::int64_t payload = 0, room = 0;
  };

  // Whether a part of `t`'s size travels as point-to-point messages: over 1 MiB (with the collective check on, those
  // are the ones preceded by a check collective); smaller ones, checked or not, take Gloo's native path.
  static bool messages(const at::Tensor& t) { return t.numel() * std::int64_t(t.element_size()) > kFramedBytes; }
  // The point-to-point messages' tag: the collective's number (every rank numbers its collectives alike).
  static int tag_of(const CollectiveId& id) { return int(id.seq % (std::uint64_t(1) << 30)); }
  // Posts `recvs` (from each rank r != this one, into `into[r]`) and `sends` (`from[r]` to rank r), then starts the
  // waiter.
  std::shared_ptr<Exchange> exchange(const CollectiveId& id, std::vector<at::Tensor>& into,
                                     std::vector<at::Tensor>& from) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    const int tag = tag_of(id);
    try {
      for (int k = 1; k < size(); ++k) {  // from the next ranks up, so that not every rank sends to rank 0 first
        const int r = (rank() + k) % size(), s = (rank() + size() - k) % size();
        std::vector<at::Tensor> in{into[std::size_t(s)]}, out{from[std::size_t(r)]};
        works.push_back(backend_->recv(in, s, tag));
        works.push_back(backend_->send(out, r, tag));
      }
      return std::make_shared<Exchange>(works);  // its waiter thread started
    } catch (const std::exception& e) {
      for (auto& w : works) w->abort();
      (void)new std::vector<c10::intrusive_ptr<c10d::Work>>(std::move(works));  // posted: left alive
      fail(id, e.what());
    }
  }
  // A large all-gather as messages: `part` to every other rank, theirs straight into `out` (or a contiguous copy
  // of it, copied back by `finish`).
  Pending all_gather_messages(const CollectiveId& id, at::Tensor& out, const at::Tensor& part) {
    const std::int64_t n = part.numel();
    auto f = std::make_shared<InFlight>();
    f->id = id, f->payload = n;
    f->buffer = out.is_contiguous() ? out : at::empty({out.numel()}, out.options());
    if (!out.is_contiguous()) f->copy_back = out;
    at::Tensor mine = f->buffer.narrow(0, std::int64_t(rank()) * n, n);
    // Sent while the others' parts arrive: a part that may overlap them travels as a copy (a part that is this
    // rank's slice of the output is sent from there).
    const bool in_place = part.is_contiguous() && part.data_ptr() == mine.data_ptr();
    const at::Tensor sent =
        in_place || (part.is_contiguous() && !part.is_alias_of(f->buffer)) ? part : part.contiguous().clone();
    if (!in_place) mine.copy_(sent);
    std::vector<at::Tensor> into, from(std::size_t(size()), sent);
    for (int r = 0; r < size(); ++r) into.push_back(f->buffer.narrow(0, std::int64_t(r) * n, n));
    f->exchange = exchange(id, into, from);
    return {id.seq, std::move(f)};
  }
  // A large reduce-scatter as messages: each rank's slice of `whole` to it, the others' slices of this rank's part
  // received and summed in rank order into `out`.
  void reduce_scatter_messages(const CollectiveId& id, at::Tensor& out, const at::Tensor& whole) {
    const std::int64_t n = out.numel();
    const at::Tensor received = at::empty({n * (size() - 1)}, whole.options());
    std::vector<at::Tensor> into, from;
    for (int r = 0, k = 0; r < size(); ++r) {
      from.push_back(whole.narrow(0, std::int64_t(r) * n, n));
      into.push_back(r == rank() ? at::Tensor() : received.narrow(0, std::int64_t(k++) * n, n));
    }
    auto ex = exchange(id, into, from);
    wait(id, ex);
    into[std::size_t(rank())] = from[std::size_t(rank())];
    at::Tensor sum = out.is_contiguous() && !out.is_alias_of(whole) ? out : at::empty({n}, out.options());
    at::add_out(sum, into[0], into[1]);
    for (int r = 2; r < size(); ++r) sum.add_(into[std::size_t(r)]);
    if (!sum.is_same(out)) out.copy_(sum);
  }
  // Waits for a collective's messages as for its work (Communicator::await); a failure stops them.
  void wait(const CollectiveId& id, const std::shared_ptr<Exchange>& ex) {
    try {
      await(id, [&](std::chrono::milliseconds slice) { return ex->wait_for(slice); });
    } catch (...) {
      ex->stop();
      (void)new std::shared_ptr<Exchange>(ex);  // the engine may still hold the buffers: left alive
      try {
        throw;
      } catch (const CommunicationError&) {
        throw;
      } catch (const std::exception& e) {
        fail(id, e.what());
      }
    }
  }

  // An all-gather's end: each sender's slots checked (a mismatch names the senders that differ), its parts copied
  // into `out`; nothing when it was gathered in place.
  void place_parts(const InFlight& f) {
    if (f.parts.empty()) return;
    const std::int64_t n = f.payload;
    std::vector<int> differ;
    for (int r = 0; r < size(); ++r)
      if (f.room && !read_check(f.parts[std::size_t(r)].narrow(0, n, f.room), f.id, 1)) differ.push_back(r);
    if (!differ.empty()) mismatch_found(f.id, differ);
    at::Tensor out = f.copy_back;
    for (int r = 0; r < size(); ++r)
      out.narrow(0, std::int64_t(r) * n, n).copy_(f.parts[std::size_t(r)].narrow(0, 0, n));
  }

  // Starts the sum `kind` (all-reduce or reduce to `root`) of `buffer`'s first `payload` elements, its check's
  // slots after them (`check_room`).
  template <class Call>
  Pending start(OpKind kind, at::Tensor& buffer, std::int64_t payload, int root, Call&& call) {
    auto id = begin(kind, buffer.scalar_type(), payload, ReduceOp::sum, root);
    const std::int64_t room = check_room(buffer.scalar_type(), payload);
    detail::require(buffer.dim() == 1 && buffer.numel() == payload + room,
                    std::string("accel: ") + (kind == OpKind::reduce ? "reduce_start" : "all_reduce_start") +
                        ": the buffer must be 1-d with " + std::to_string(room) + " elements after the payload");
    if (room)
      carry_unchecked(id), write_check(buffer.narrow(0, payload, room), id);
    else
      leave_unchecked(id);
    auto f = std::make_shared<InFlight>();
    f->id = id, f->buffer = buffer, f->payload = payload, f->room = room;
    std::vector<at::Tensor> v{buffer};
    try {
      f->work = call(v);
    } catch (const std::exception& e) {
      fail(id, e.what());
    }
    return {id.seq, std::move(f)};
  }

  // Whether an all-reduce or a broadcast of `numel` elements carries a check: not one or two elements, which
  // Gloo reduces in a fifth of the time of three (0.15 ms against 1 ms on loopback) and whose check would cost
  // more than the data; the next collective that carries a check checks them too.
  static bool framed_all_reduce(std::int64_t numel) { return numel > 2; }
  // How `id` is checked: with its slots after a copy of `t` (true; small payloads), by a check collective first
  // (large ones), or not at all (no room: its fingerprint travels with the next checked collective).
  bool framing(CollectiveId& id, const at::Tensor& t, std::int64_t room) {
    if (room > 0 && t.numel() * std::int64_t(t.element_size()) <= kFramedBytes) {
      carry_unchecked(id);
      return true;
    }
    if (room > 0)
      check(id);
    else
      leave_unchecked(id);
    return false;
  }
  // `t` flattened, followed by this rank's slots for `id` (which takes the unchecked collectives before it).
  static at::Tensor framed_copy(const at::Tensor& t, const CollectiveId& id, std::int64_t room) {
    at::Tensor buffer = at::empty({t.numel() + room}, t.options());
    buffer.narrow(0, 0, t.numel()).copy_(t.reshape({-1}));
    write_check(buffer.narrow(0, t.numel(), room), id);
    return buffer;
  }
  // The check on its own: an all-reduce (sum) of `id`'s bits, before a large payload or as a barrier.
  void check(CollectiveId& id) {
    carry_unchecked(id);
    at::Tensor bits = at::empty({slots(at::kInt)}, at::TensorOptions().dtype(at::kInt));
    write_check(bits, id);
    std::vector<at::Tensor> v{bits};
    c10d::AllreduceOptions o;
    o.timeout = options().timeout;
    run(id, [&] { return backend_->allreduce(v, o); });
    if (!read_check(bits, id, size())) mismatch_found(id, {});
  }

  // Waits for `work` (Communicator::await: watched after a second, bounded by the timeout).
  void wait(const CollectiveId& id, const c10::intrusive_ptr<c10d::Work>& work) {
    try {
      await(id, [&](std::chrono::milliseconds slice) {
        try {
          work->wait(slice);
          return true;
        } catch (const std::exception&) {
          if (!work->isCompleted()) return false;  // the slice ended, not the collective
        }
        work->wait();  // it completed meanwhile: returns, or throws its own error
        return true;
      });
    } catch (const CommunicationError&) {
      throw;
    } catch (const std::exception& e) {
      fail(id, e.what());
    }
  }
  template <class Start>
  void run(const CollectiveId& id, Start&& start) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = start();
    } catch (const std::exception& e) {
      fail(id, e.what());
    }
    wait(id, work);
  }

  std::unique_ptr<rendezvous::Rendezvous> rdzv_;
  c10::intrusive_ptr<c10d::Backend> backend_;
};

}  // namespace accel::comm

#if ACCEL_DEFINITIONS
#include <accel/comm/impl/gloo.ipp>
#endif
