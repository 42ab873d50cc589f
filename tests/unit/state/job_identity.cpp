// The job's keys and what its launcher writes there (state/rendezvous/job_identity.hpp): the prefix of an attempt, and
// the rank that ended as a launcher reports it (Note [Ended ranks]), read back exactly or refused.
#include <accel/state/rendezvous/job_identity.hpp>
#include <catch2/catch.hpp>

#include <string>

TEST_CASE("a rank that ended, as its launcher reports it", "[comm][ended]") {
  using accel::rendezvous::EndedRank;
  CHECK(accel::rendezvous::job_prefix("job-1", 2) == "accel/job-1/2/");
  CHECK(EndedRank::key("job-1", 2) == "accel/job-1/2/ended");
  SECTION("round trip") {
    const EndedRank killed{3, 9, "was killed by signal 9 (Killed)"};
    CHECK(killed.encode() == "3 9 was killed by signal 9 (Killed)");
    const auto back = EndedRank::decode(killed.encode());
    REQUIRE(back);
    CHECK((back->rank == 3 && back->signal == 9 && back->what == killed.what));
    const auto exited = EndedRank::decode(EndedRank{0, 0, "exited with code 1"}.encode());
    REQUIRE(exited);
    CHECK((exited->rank == 0 && exited->signal == 0 && exited->what == "exited with code 1"));
  }
  SECTION("anything else is refused, never half read") {
    for (const std::string bad : {"", "1", "1 9", "1 9 ", "x 9 killed", "1 x killed", "-1 9 killed", "1 -9 killed",
                                  "1,9 killed", "1 9,killed", "99999999999999999999 9 killed"})
      CHECK_FALSE(EndedRank::decode(bad));
  }
  SECTION("its text is bounded: it ends up in error messages") {
    const auto long_one = EndedRank::decode("1 9 " + std::string(10000, 'x'));
    REQUIRE(long_one);
    CHECK(long_one->what.size() == 200);
  }
}
