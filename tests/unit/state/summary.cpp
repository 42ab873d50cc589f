// The heartbeat's summary (state/rendezvous/summary.hpp) read back exactly or refused, the differences it finds between
// the ranks' published collectives, and the store requests the heartbeat at scale is built on
// (state/rendezvous/store.hpp: `rewrite`, `peek`, `try_get_all`), counted, against a real TCPStore on loopback.
#include <accel/state/rendezvous/listen.hpp>
#include <accel/state/rendezvous/store.hpp>
#include <accel/state/rendezvous/summary.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace summary_test {
using accel::comm::CollectiveId;
using accel::comm::OpKind;
using accel::rendezvous::Summary;

CollectiveId op(std::uint64_t seq, OpKind kind, std::int64_t numel) {
  return {seq, kind, accel::comm::ReduceOp::sum, c10::kFloat, numel, 0};
}
std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace summary_test

TEST_CASE("the heartbeat's summary reads back exactly, or is refused", "[comm][summary]") {
  using namespace summary_test;
  SECTION("ranges of ranks") {
    CHECK(Summary::ranks_text({}) == "");
    CHECK(Summary::ranks_text({3}) == "3");
    CHECK(Summary::ranks_text({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8");
    CHECK(Summary::ranks_of("0-2,5,7-8") == std::vector<int>{0, 1, 2, 5, 7, 8});
    CHECK_THROWS(Summary::ranks_of("5-2"));
  }
  SECTION("round trip") {
    Summary s;
    s.round = 41;
    s.ended = accel::rendezvous::EndedRank{3, 9, "was killed by signal 9 (Killed)"};
    s.late = {{2, 1500}, {700, 31000}};
    s.failed = {4, 5, 6, 9};
    s.mismatches = {{{op(12, OpKind::all_reduce, 4), {0, 1, 3}}, {op(12, OpKind::all_gather, 12), {2}}}};
    const auto back = Summary::decode(s.encode());
    REQUIRE(back);
    CHECK(back->round == 41);
    REQUIRE(back->ended);
    CHECK((back->ended->rank == 3 && back->ended->signal == 9));
    REQUIRE(back->late.size() == 2);
    CHECK((back->late[1].rank == 700 && back->late[1].age_ms == 31000));
    CHECK(back->failed == std::vector<int>{4, 5, 6, 9});
    REQUIRE(back->mismatches.size() == 1);
    REQUIRE(back->mismatches[0].size() == 2);
    CHECK(back->mismatches[0][1].id == op(12, OpKind::all_gather, 12));
    CHECK(back->mismatches[0][0].ranks == std::vector<int>{0, 1, 3});
    const auto empty = Summary::decode(Summary{}.encode());
    REQUIRE(empty);
    CHECK((empty->round == 0 && !empty->ended && empty->late.empty() && empty->failed.empty()));
  }
  SECTION("anything else is refused") {
    for (const std::string bad :
         {"", "garbage", "S x\n", "S 1\nL 3\n", "S 1\nQ 2\n", "S 1\nM 1 2 3=0\n", "S 1\nF 9-2\n",
          // forged: ranks and ages out of range, never a loop past INT_MAX or an overflow
          "S 1\nF 2147483000-2147483647\n", "S 1\nF -1\n", "S 1\nL -3:5\n", "S 1\nL 3:-5\n",
          "S 1\nL 3:9223372036854775807\n", "S 1\nF 0-16000000,0-16000000\n"})
      CHECK_FALSE(Summary::decode(bad));
  }
  SECTION("the launcher's text stays on its line") {
    Summary s;
    s.ended = accel::rendezvous::EndedRank{2, 0, "exited\nwith code 1"};
    s.failed = {1};
    const auto back = Summary::decode(s.encode());
    REQUIRE(back);
    CHECK(back->failed == std::vector<int>{1});
  }
}

TEST_CASE("the aggregator finds the collectives on which ranks differ", "[comm][summary]") {
  using namespace summary_test;
  // Rank 2 issued an all_gather where the others issued an all_reduce as #12; #11 and #13 agree.
  std::vector<std::vector<CollectiveId>> published(4);
  for (int r = 0; r < 4; ++r)
    published[std::size_t(r)] = {op(11, OpKind::broadcast, 1),
                                 op(12, r == 2 ? OpKind::all_gather : OpKind::all_reduce, 4)};
  published[1].push_back(op(13, OpKind::barrier, 0));  // ahead of the others: no disagreement
  const auto d = Summary::differences(published);
  REQUIRE(d.size() == 1);
  REQUIRE(d[0].size() == 2);
  for (const auto& v : d[0]) {
    CHECK(v.id.seq == 12);
    CHECK(v.ranks == (v.id.kind == OpKind::all_gather ? std::vector<int>{2} : std::vector<int>{0, 1, 3}));
  }
  SECTION("the earliest few only") {
    std::vector<std::vector<CollectiveId>> many(2);
    for (std::uint64_t s = 1; s <= 20; ++s)
      many[0].push_back(op(s, OpKind::all_reduce, 1)), many[1].push_back(op(s, OpKind::broadcast, 1));
    const auto few = Summary::differences(many);
    REQUIRE(few.size() == Summary::kMismatches);
    CHECK(few.front().front().id.seq == 1);
  }
}

TEST_CASE("the heartbeat's store requests: one each, counted, and a foreign writer reported",
          "[comm][summary][store]") {
  using namespace summary_test;
  using accel::rendezvous::JobStore;
  using accel::rendezvous::StoreTraffic;
  auto server = accel::rendezvous::host_store("127.0.0.1", 0, std::chrono::seconds(10));
  auto raw = accel::rendezvous::connect_store("127.0.0.1", server->getPort(), std::chrono::seconds(10));
  for (const std::string& secret : {std::string(), std::string("s3cret")}) {
    CAPTURE(secret);
    const std::string p = secret.empty() ? "plain/" : "sealed/";
    JobStore kv(raw, secret, "rank 0");
    const auto t0 = StoreTraffic::now();
    // rewrite: one compare-and-set while the key holds what this process wrote
    auto written = kv.rewrite(p + "beat", {}, bytes("1 0\n"));
    written = kv.rewrite(p + "beat", written, bytes("2 0\n"));
    CHECK(StoreTraffic::now().requests - t0.requests == 2);
    CHECK(kv.peek(p + "beat") == bytes("2 0\n"));
    // a foreign writer: reported, and the key written again (one more request)
    raw->set(p + "beat", bytes("999999 1\n"));
    const auto t1 = StoreTraffic::now();
    written = kv.rewrite(p + "beat", written, bytes("3 0\n"));
    CHECK(StoreTraffic::now().requests - t1.requests == 2);
    CHECK(kv.peek(p + "beat") == bytes("3 0\n"));
    // peek: one request, never blocks on an absent key, changes nothing
    const auto t2 = StoreTraffic::now();
    CHECK_FALSE(kv.peek(p + "absent"));
    CHECK(StoreTraffic::now().requests - t2.requests == 1);
    CHECK_FALSE(raw->check({p + "absent"}));
    // try_get_all: a check and a multi-get when every key exists, whatever their number
    std::vector<std::string> keys;
    for (int r = 0; r < 50; ++r) {
      keys.push_back(p + "k/" + std::to_string(r));
      kv.set(keys.back(), bytes(std::to_string(r)));
    }
    const auto t3 = StoreTraffic::now();
    const auto all = kv.try_get_all(keys);
    CHECK(StoreTraffic::now().requests - t3.requests == 2);
    CHECK(StoreTraffic::now().keys - t3.keys == 100);
    REQUIRE(all.size() == 50);
    CHECK(all[49] == bytes("49"));
    // one absent: one by one, the absent one empty
    keys.push_back(p + "k/absent");
    const auto some = kv.try_get_all(keys);
    CHECK((some[7] == bytes("7") && !some[50]));
    if (!secret.empty()) {  // a forged value is nothing, never trusted
      raw->set(keys[3], bytes("forged"));
      CHECK_FALSE(kv.try_get_all(keys)[3]);
      CHECK_FALSE(kv.peek(keys[3]));
    }
  }
}
