// Launcher environments (state/launch_env.hpp): torchrun, Open MPI, MVAPICH, MPICH/Intel MPI, PMIx, SLURM, explicit
// arguments, the restart count; garbage is a clear error.
#include "../support.hpp"

#include <accel/state/launch_env.hpp>
#include <catch2/catch.hpp>
#include <map>
#include <string>

using namespace accel_test;
namespace data = accel::data;

namespace {
using Env = std::map<std::string, std::string>;
accel::EnvLookup lookup(Env env) {
  return [env = std::move(env)](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}
accel::LaunchEnv detect(Env env, accel::LaunchOverrides over = {}) {
  return accel::detect_launch_env(lookup(std::move(env)), over);
}
}  // namespace

TEST_CASE("launcher environments", "[state][env]") {
  SECTION("nothing set: one process") {
    const auto e = detect({});
    CHECK(e.world_size == 1);
    CHECK(e.rank == 0);
    CHECK(e.launcher == "none");
    CHECK(!e.distributed());
  }
  SECTION("torchrun / accel-launch") {
    const auto e = detect({{"RANK", "3"},
                           {"WORLD_SIZE", "4"},
                           {"LOCAL_RANK", "1"},
                           {"LOCAL_WORLD_SIZE", "2"},
                           {"MASTER_ADDR", "10.1.2.3"},
                           {"MASTER_PORT", "29600"}});
    CHECK(e.launcher == "torchrun");
    CHECK((e.rank == 3 && e.world_size == 4 && e.local_rank == 1 && e.local_world_size == 2));
    CHECK((e.master_addr == "10.1.2.3" && e.master_port == 29600));
    CHECK(!e.agent_store);
    CHECK(detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}})
              .agent_store);
  }
  SECTION("Open MPI") {
    const auto e = detect({{"OMPI_COMM_WORLD_RANK", "2"},
                           {"OMPI_COMM_WORLD_SIZE", "3"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
    CHECK(e.launcher == "mpi");
    CHECK((e.rank == 2 && e.world_size == 3 && e.local_rank == 2));
    CHECK((e.master_addr == "127.0.0.1" && e.master_port == 29500));  // one node: loopback defaults
  }
  SECTION("MPICH and Intel MPI (Hydra), MVAPICH") {
    const auto mpich = detect({{"PMI_RANK", "3"},
                               {"PMI_SIZE", "4"},
                               {"MPI_LOCALRANKID", "1"},
                               {"MPI_LOCALNRANKS", "2"},
                               {"MASTER_ADDR", "node0"}});
    CHECK(mpich.launcher == "mpi");
    CHECK((mpich.rank == 3 && mpich.world_size == 4 && mpich.local_rank == 1 && mpich.local_world_size == 2));
    CHECK((mpich.master_addr == "node0" && mpich.master_port == 29500));
    const auto mv2 = detect({{"MV2_COMM_WORLD_RANK", "2"},
                             {"MV2_COMM_WORLD_SIZE", "3"},
                             {"MV2_COMM_WORLD_LOCAL_RANK", "2"},
                             {"MV2_COMM_WORLD_LOCAL_SIZE", "3"}});
    CHECK(mv2.launcher == "mpi");
    CHECK((mv2.rank == 2 && mv2.world_size == 3 && mv2.local_rank == 2 && mv2.local_world_size == 3));
    CHECK(mv2.master_addr == "127.0.0.1");  // one node
    // MVAPICH's mpirun_rsh may set PMI_RANK too: its own variables (with the local rank) come first.
    CHECK(detect({{"MV2_COMM_WORLD_RANK", "1"},
                  {"MV2_COMM_WORLD_SIZE", "2"},
                  {"MV2_COMM_WORLD_LOCAL_RANK", "0"},
                  {"MV2_COMM_WORLD_LOCAL_SIZE", "1"},
                  {"PMI_RANK", "1"},
                  {"PMI_SIZE", "2"},
                  {"MASTER_ADDR", "a"}})
              .local_rank == 0);
  }
  SECTION("srun --mpi=pmi2 sets PMI_RANK without local variables: SLURM's are read") {
    const auto e = detect({{"PMI_RANK", "5"},
                           {"PMI_SIZE", "8"},
                           {"SLURM_PROCID", "5"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "1"},
                           {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                           {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                           {"SLURM_JOB_ID", "7"}});
    CHECK(e.launcher == "slurm");
    CHECK((e.rank == 5 && e.local_rank == 1 && e.local_world_size == 4 && e.master_addr == "gpu07"));
    // mpiexec (Hydra) inside a SLURM allocation: SLURM_PROCID is the proxy's, MPI_LOCALRANKID says Hydra started us.
    const auto hydra = detect({{"PMI_RANK", "3"},
                               {"PMI_SIZE", "4"},
                               {"MPI_LOCALRANKID", "1"},
                               {"MPI_LOCALNRANKS", "2"},
                               {"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "2"},
                               {"MASTER_ADDR", "n1"}});
    CHECK((hydra.launcher == "mpi" && hydra.rank == 3 && hydra.world_size == 4 && hydra.local_rank == 1));
  }
  SECTION("PMIx: the rank from PMIX_RANK, the size from Open MPI's or PMIX_SIZE") {
    const auto e = detect({{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "prterun-host-1234@1"}, {"PMIX_SIZE", "2"}});
    CHECK(e.launcher == "mpi");
    CHECK((e.rank == 1 && e.world_size == 2 && e.local_rank == 1 && e.local_world_size == 2));
    const auto several = detect({{"PMIX_RANK", "3"},
                                 {"PMIX_SIZE", "4"},
                                 {"PMIX_LOCAL_RANK", "1"},
                                 {"PMIX_LOCAL_SIZE", "2"},
                                 {"MASTER_ADDR", "head"},
                                 {"MASTER_PORT", "4000"}});
    CHECK((several.local_rank == 1 && several.local_world_size == 2 && several.master_addr == "head" &&
           several.master_port == 4000));
    // srun --mpi=pmix sets PMIX_RANK and SLURM's variables: SLURM's come first.
    CHECK(detect({{"PMIX_RANK", "1"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}).launcher == "slurm");
  }
  SECTION("the restart count (TORCHELASTIC_RESTART_COUNT)") {
    CHECK(detect({}).restart_count == 0);
    CHECK(detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "5000"}, {"TORCHELASTIC_RESTART_COUNT", "3"}})
              .restart_count == 3);
  }
  SECTION("SLURM: master from the node list, port from the job id") {
    const auto e = detect({{"SLURM_PROCID", "5"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "1"},
                           {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                           {"SLURM_JOB_NODELIST", "gpu[07-08,11],login1"},
                           {"SLURM_JOB_ID", "123456"}});
    CHECK(e.launcher == "slurm");
    CHECK((e.rank == 5 && e.world_size == 8 && e.local_rank == 1 && e.local_world_size == 4));
    CHECK(e.master_addr == "gpu07");
    CHECK(e.master_port == 20000 + 123456 % 20000);
    CHECK(accel::detail::first_slurm_host("a,b") == "a");
    CHECK(accel::detail::first_slurm_host("node[1-3]") == "node1");
    const auto explicit_master = detect({{"SLURM_PROCID", "0"},
                                         {"SLURM_NTASKS", "2"},
                                         {"SLURM_JOB_NODELIST", "n[1-2]"},
                                         {"MASTER_ADDR", "head"},
                                         {"MASTER_PORT", "4000"}});
    CHECK((explicit_master.master_addr == "head" && explicit_master.master_port == 4000));
  }
  SECTION("torchrun's variables win over MPI's and SLURM's") {
    const auto e = detect({{"RANK", "1"},
                           {"WORLD_SIZE", "2"},
                           {"MASTER_PORT", "5000"},
                           {"OMPI_COMM_WORLD_RANK", "0"},
                           {"SLURM_PROCID", "0"}});
    CHECK((e.launcher == "torchrun" && e.rank == 1));
  }
  SECTION("explicit arguments win over the environment") {
    const auto e = detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "5000"}},
                          {.rank = 0, .world_size = 3, .master_addr = "127.0.0.2", .master_port = 6000});
    CHECK((e.rank == 0 && e.world_size == 3 && e.master_addr == "127.0.0.2" && e.master_port == 6000));
    const auto args_only = detect({}, {.rank = 1, .world_size = 2, .master_port = 7000});
    CHECK((args_only.launcher == "arguments" && args_only.local_rank == 1 && args_only.local_world_size == 2));
  }
}

TEST_CASE("garbage in the environment is a clear error naming the variable", "[state][env][errors]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(detect({{"RANK", "abc"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "5000"}}),
                    Contains("environment variable RANK='abc' is not an integer"));
  CHECK_THROWS_WITH(detect({{"RANK", "0"}, {"WORLD_SIZE", "2x"}, {"MASTER_PORT", "5000"}}),
                    Contains("WORLD_SIZE='2x' is not an integer"));
  CHECK_THROWS_WITH(detect({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "5000"}}),
                    Contains("RANK=2 is out of range for WORLD_SIZE=2; ranks go from 0 to 1"));
  CHECK_THROWS_WITH(detect({{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "5000"}}),
                    Contains("RANK=-1 is out of range"));
  CHECK_THROWS_WITH(detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
                    Contains("WORLD_SIZE=2 but MASTER_PORT is not set; set MASTER_PORT (and MASTER_ADDR)"));
  CHECK_THROWS_WITH(detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
                    Contains("MASTER_PORT=70000 is out of range; use a TCP port between 1 and 65535"));
  CHECK_THROWS_WITH(detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}),
                    Contains("MASTER_PORT=0 is out of range"));
  CHECK_THROWS_WITH(detect({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_PORT", "5000"}}),
                    Contains("spans several nodes (WORLD_SIZE=4, LOCAL_WORLD_SIZE=2) but MASTER_ADDR is not set"));
  CHECK_THROWS_WITH(detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "5"}, {"MASTER_PORT", "5000"}}),
                    Contains("the local rank (5) is out of range"));
  CHECK_THROWS_WITH(detect({{"OMPI_COMM_WORLD_RANK", "x"}}),
                    Contains("OMPI_COMM_WORLD_RANK='x' is not an integer; mpirun sets it"));
  CHECK_THROWS_WITH(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}),
                    Contains("SLURM_NTASKS=0 must be at least 1"));
  CHECK_THROWS_WITH(detect({}, {.rank = 3, .world_size = 2}),
                    Contains("rank argument=3 is out of range for world_size argument=2"));
  CHECK_THROWS_AS(detect({{"RANK", "abc"}}), accel::InvalidArgument);
  // An MPI job on several nodes without MASTER_ADDR: 127.0.0.1 could never work on the second node.
  CHECK_THROWS_WITH(
      detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
      Contains("the MPI job spans several nodes (OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_SIZE=2) but "
               "MASTER_ADDR is not set; export MASTER_ADDR=<address of the node running rank 0"));
  CHECK_THROWS_WITH(detect({{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}}),
                    Contains("(PMI_SIZE=4, MPI_LOCALNRANKS=1) but MASTER_ADDR is not set"));
  CHECK_THROWS_WITH(
      detect({{"MV2_COMM_WORLD_RANK", "0"}, {"MV2_COMM_WORLD_SIZE", "2"}, {"MV2_COMM_WORLD_LOCAL_SIZE", "1"}}),
      Contains("(MV2_COMM_WORLD_SIZE=2, MV2_COMM_WORLD_LOCAL_SIZE=1) but MASTER_ADDR is not set"));
  CHECK_THROWS_WITH(detect({{"OMPI_COMM_WORLD_RANK", "0"},
                            {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                            {"MASTER_ADDR", ""}}),
                    Contains("but MASTER_ADDR is not set"));
  CHECK_NOTHROW(
      detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
             {.master_addr = "10.0.0.1"}));
  CHECK_THROWS_WITH(detect({{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "ns"}}),
                    Contains("PMIX_RANK=1 is set, but no variable gives the number of processes: PMIx exports only the "
                             "rank and its namespace; export PMIX_SIZE"));
  CHECK_THROWS_WITH(detect({{"PMI_RANK", "0"}, {"PMI_SIZE", "two"}, {"MPI_LOCALRANKID", "0"}}),
                    Contains("PMI_SIZE='two' is not an integer; mpiexec (MPICH, Intel MPI) sets it"));
  CHECK_THROWS_WITH(
      detect({{"TORCHELASTIC_RESTART_COUNT", "x"}}),
      Contains("TORCHELASTIC_RESTART_COUNT='x' is not an integer; the launcher (accel-launch, torchrun) sets it"));
  CHECK_THROWS_WITH(detect({{"TORCHELASTIC_RESTART_COUNT", "-1"}}),
                    Contains("TORCHELASTIC_RESTART_COUNT=-1 must be at least 0"));
}
