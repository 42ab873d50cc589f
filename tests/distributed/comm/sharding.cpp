// The sharding collectives (comm/communicator.hpp: reduce_scatter, all_gather_into and all_gather_into_start,
// broadcast_coalesced, reduce_start) on N real processes, small (the check's slots after the data) and large (a check
// collective first), value by value; and a reduce-scatter against another collective, which every rank must name.
#include "../harness.hpp"

#include <accel/comm/communicator.hpp>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace mp {

void sharding_collectives(const Args&) {
  accel::ProcessState state(options(30000));
  const int N = state.num_processes(), r = state.process_index();
  tally.rank = r;
  auto* comm = state.comm();
  // Small (framed) and large (over 1 MiB: checked by a collective of its own) payloads.
  for (const std::int64_t n : {std::int64_t(5), std::int64_t(300000)}) {
    const std::string size = " (" + std::to_string(n) + " per rank)";
    // reduce_scatter: rank k contributes arange * (k + 1); part r of the sum is arange's part r * N(N+1)/2.
    const at::Tensor base = at::arange(n * N, at::kFloat);
    at::Tensor part = at::zeros({n}, at::kFloat);
    comm->reduce_scatter(part, base * float(r + 1));
    const at::Tensor want = base.narrow(0, r * n, n) * float(N * (N + 1) / 2);
    check(same(part, want), "reduce_scatter: this rank's part of the sum" + size);
    at::Tensor doubles = at::zeros({n}, at::kDouble);
    comm->reduce_scatter(doubles, at::full({n * N}, double(r), at::kDouble));
    check(same(doubles, at::full({n}, double(N * (N - 1) / 2), at::kDouble)), "reduce_scatter of doubles" + size);
    // all_gather_into: from a separate part, and in place (the part is a view of the output's own slice).
    at::Tensor flat = at::zeros({n * N}, at::kFloat);
    comm->all_gather_into(flat, at::full({n}, float(r + 1), at::kFloat));
    bool ok = true;
    for (int k = 0; k < N; ++k) ok = ok && same(flat.narrow(0, k * n, n), at::full({n}, float(k + 1), at::kFloat));
    check(ok, "all_gather_into: every rank's part in rank order" + size);
    at::Tensor inplace = at::zeros({n * N}, at::kLong);
    inplace.narrow(0, r * n, n).fill_(r * 10 + 1);
    const at::Tensor mine = inplace.narrow(0, r * n, n);
    comm->all_gather_into(inplace, mine);
    ok = true;
    for (int k = 0; k < N; ++k)
      ok = ok && same(inplace.narrow(0, k * n, n), at::full({n}, std::int64_t(k * 10 + 1), at::kLong));
    check(ok, "all_gather_into in place" + size);
    // all_gather_into_start (full sharding's prefetch): two in flight at once, one in place, each equal to the
    // blocking one's result once finished; one collective each.
    const auto before = comm->sequence();
    at::Tensor a = at::zeros({n * N}, at::kFloat), b = at::zeros({n * N}, at::kLong);
    const at::Tensor part_a = at::arange(n, at::kFloat) + float(1000 * r);
    b.narrow(0, r * n, n).fill_(r * 10 + 1);
    auto pa = comm->all_gather_into_start(a, part_a);
    auto pb = comm->all_gather_into_start(b, b.narrow(0, r * n, n));
    check(comm->sequence() == before + 2, "all_gather_into_start: one collective each" + size);
    comm->finish(pb);
    comm->finish(pa);
    comm->finish(pa);  // finished already: nothing
    at::Tensor want_a = at::zeros({n * N}, at::kFloat);
    comm->all_gather_into(want_a, part_a);
    ok = same(b, inplace);
    for (int k = 0; k < N; ++k) ok = ok && same(a.narrow(0, k * n, n), at::arange(n, at::kFloat) + float(1000 * k));
    check(ok && same(a, want_a), "all_gather_into_start / finish equals all_gather_into" + size);
    // Strided outputs and parts (large ones travel as point-to-point messages: into a contiguous copy, copied back),
    // a reduce-scatter into its own input's slice, and bf16.
    at::Tensor wide = at::zeros({2 * n * N}, at::kFloat), strided = wide.slice(0, 0, 2 * n * N, 2);
    const at::Tensor every_other = (at::arange(2 * n, at::kFloat) + float(1000 * r)).slice(0, 0, 2 * n, 2);
    comm->all_gather_into(strided, every_other);
    ok = same(wide.slice(0, 1, 2 * n * N, 2), at::zeros({n * N}, at::kFloat));
    for (int k = 0; k < N; ++k)
      ok = ok &&
           same(strided.narrow(0, k * n, n), (at::arange(2 * n, at::kFloat) + float(1000 * k)).slice(0, 0, 2 * n, 2));
    check(ok, "all_gather_into a strided output from a strided part" + size);
    at::Tensor own = base * float(r + 1);
    at::Tensor slice = own.narrow(0, r * n, n);
    comm->reduce_scatter(slice, own);
    check(same(slice, want), "reduce_scatter into this rank's slice of its own input" + size);
    at::Tensor halves = at::zeros({2 * n}, at::kBFloat16);  // as many bytes per rank as the floats
    comm->reduce_scatter(halves, at::full({2 * n * N}, float(r + 1), at::kBFloat16));
    check(same(halves, at::full({2 * n}, float(N * (N + 1) / 2), at::kBFloat16)), "reduce_scatter of bf16" + size);
  }
  // all_gather_into_start returns before the other ranks have started theirs (it runs in the background); finish
  // waits for them. The others start a second later; a small payload carries its check and does not wait at start.
  {
    at::Tensor out = at::zeros({3 * N}, at::kFloat);
    if (r != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto t0 = std::chrono::steady_clock::now();
    auto p = comm->all_gather_into_start(out, at::full({3}, float(r), at::kFloat));
    const auto started = std::chrono::steady_clock::now() - t0;
    comm->finish(p);
    const auto finished = std::chrono::steady_clock::now() - t0;
    bool ok = true;
    for (int k = 0; k < N; ++k) ok = ok && same(out.narrow(0, k * 3, 3), at::full({3}, float(k), at::kFloat));
    check(ok, "all_gather_into_start with late peers: every rank's part");
    if (r == 0)
      check(started < std::chrono::milliseconds(300) && finished > std::chrono::milliseconds(500),
            "all_gather_into_start returns at once, finish waits for the late peers (" +
                std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(started).count()) + " ms, " +
                std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(finished).count()) + " ms)");
  }
  // reduce_start (ZeRO stage 2's buckets): every root, overlapping (two in flight), with and without check room;
  // the root ends with the sum, the room holds no payload.
  for (const std::int64_t n : {std::int64_t(2), std::int64_t(7), std::int64_t(300000)}) {
    std::vector<at::Tensor> buffers;
    std::vector<accel::comm::Communicator::Pending> pending;
    for (int root = 0; root < N; ++root) {
      const std::int64_t room = comm->check_room(at::kFloat, n);
      buffers.push_back(at::zeros({n + room}, at::kFloat));
      buffers.back().narrow(0, 0, n).copy_(at::arange(n, at::kFloat) * float(r + 1) + float(root));
      pending.push_back(comm->reduce_start(buffers.back(), n, root));
    }
    for (int root = 0; root < N; ++root) {
      comm->finish(pending[std::size_t(root)]);
      if (root != r) continue;
      const at::Tensor want = at::arange(n, at::kFloat) * float(N * (N + 1) / 2) + float(N * root);
      check(same(buffers[std::size_t(root)].narrow(0, 0, n), want),
            "reduce_start: the root holds the sum (" + std::to_string(n) + " elements)");
    }
  }
  // broadcast_coalesced: several dtypes and shapes, one collective, from rank 0 and from the last rank.
  for (const int root : {0, N - 1}) {
    std::vector<at::Tensor> ts{at::full({3, 2}, float(r), at::kFloat), at::full({4}, std::int64_t(r), at::kLong),
                               at::full({2}, double(r) + 0.5, at::kDouble), at::zeros({0}, at::kFloat)};
    const auto before = comm->sequence();
    comm->broadcast_coalesced(ts, root);
    check(comm->sequence() == before + 1, "broadcast_coalesced is one collective");
    check(same(ts[0], at::full({3, 2}, float(root), at::kFloat)) &&
              same(ts[1], at::full({4}, std::int64_t(root), at::kLong)) &&
              same(ts[2], at::full({2}, double(root) + 0.5, at::kDouble)),
          "broadcast_coalesced from rank " + std::to_string(root));
  }
  // A part that is not 1/N of the whole: a clear error before any communication.
  at::Tensor bad = at::zeros({3}, at::kFloat);
  try {
    comm->reduce_scatter(bad, at::ones({3 * N + 1}));
    check(false, "reduce_scatter of an uneven whole is refused");
  } catch (const accel::InvalidArgument& e) {
    check(std::string(e.what()).find("pad the whole to a multiple of N") != std::string::npos,
          "uneven whole: the message says the fix");
  }
}

}  // namespace mp
