#pragma once
//! \file
//! Which process this is: rank, world size, local rank and rendezvous address, read from the launcher's
//! environment. A pure function of an environment lookup, so every launcher and every kind of garbage is
//! testable without starting processes.
//!
//! ## Precedence (first match wins, per field)
//! 1. explicit `LaunchOverrides` (constructor arguments) — always win (Accelerate lets an environment
//!    variable win over an argument; accel does not, DESIGN "Q2");
//! 2. torchrun and accel-launch: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`;
//! 3. MPI launchers: Open MPI (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`), MVAPICH
//!    (`MV2_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`), MPICH and Intel MPI (`PMI_RANK`, `PMI_SIZE`,
//!    `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`; but `srun --mpi=pmi2` sets `PMI_RANK` too, without the local variables:
//!    with `SLURM_PROCID` and no `MPI_LOCALRANKID`, SLURM's variables are read instead);
//! 4. SLURM (`srun`): `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`; the master address
//!    is `MASTER_ADDR` or else the first host of `SLURM_JOB_NODELIST`, the port `MASTER_PORT` or else
//!    `20000 + SLURM_JOB_ID % 20000` (every task of a job computes the same one);
//! 5. PMIx (`prterun`, `srun --mpi=pmix`, Flux): `PMIX_RANK`. PMIx exports only the rank and the namespace
//!    (`PMIX_NAMESPACE`) to a process, never the job's size (that is `PMIx_Get(PMIX_JOB_SIZE)`), so the size comes
//!    from `OMPI_COMM_WORLD_SIZE` or `PMIX_SIZE` (exported by the user), and missing, it is an error;
//! 6. nothing set: one process.
//! The family is chosen by its rank variable, in this order. Under MPI and SLURM the port defaults to 29500 and, on
//! a single node, the master address to 127.0.0.1; an MPI job on several nodes (local size != world size) needs
//! `MASTER_ADDR` (an error names it).
//!
//! `TORCHELASTIC_RESTART_COUNT` (torchrun's and accel-launch's restart generation) is `LaunchEnv::restart_count`.

#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <array>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace accel {

//! Arguments that override the environment (all optional).
struct LaunchOverrides {
  //!@{
  //! Each, when set, replaces what the environment says (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`).
  std::optional<int> rank, world_size, local_rank, local_world_size;
  //!@}
  std::optional<std::string> master_addr;  //!< replaces `MASTER_ADDR`
  std::optional<int> master_port;          //!< replaces `MASTER_PORT`
};

//! Where this process stands in the job.
struct LaunchEnv {
  int rank = 0;                           //!< this process's rank (`RANK`)
  int world_size = 1;                     //!< the number of processes (`WORLD_SIZE`)
  int local_rank = 0;                     //!< its index on its node (`LOCAL_RANK`)
  int local_world_size = 1;               //!< processes on its node (`LOCAL_WORLD_SIZE`)
  std::string master_addr = "127.0.0.1";  //!< where rank 0's store listens (`MASTER_ADDR`)
  int master_port = 29500;                //!< `MASTER_PORT`
  std::string launcher =
      "none";  //!< "none", "torchrun", "mpi" (Open MPI, MVAPICH, MPICH, Intel MPI, PMIx), "slurm", "arguments"
  //! torchrun's agent already hosts the rendezvous store at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
  //! rank 0 connects to it instead of starting one.
  bool agent_store = false;
  //! Which attempt of the job this is: 0, then 1 after the launcher's first restart (`TORCHELASTIC_RESTART_COUNT`,
  //! set by accel-launch --max-restarts and torchrun). Every rendezvous key is scoped by it.
  int restart_count = 0;
  //! Whether the job has several processes.
  [[nodiscard]] bool distributed() const noexcept { return world_size > 1; }
};

//! Reads one environment variable; `std::nullopt` when unset.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

//! The process environment.
inline std::optional<std::string> process_env(std::string_view name) {
  if (const char* v = std::getenv(std::string(name).c_str())) return std::string(v);
  return std::nullopt;
}

namespace detail {

inline int parse_int(std::string_view name, const std::string& value, std::string_view hint) {
  int out = 0;
  const char* first = value.data();
  const char* last = first + value.size();
  while (first < last && *first == ' ') ++first;
  auto [p, ec] = std::from_chars(first, last, out);
  if (ec != std::errc() || p != last || first == last)
    throw InvalidArgument("accel: environment variable " + std::string(name) + "='" + value + "' is not an integer; " +
                          std::string(hint));
  return out;
}

//! The first host of a SLURM node list: "node[01-04,07],gpu9" -> "node01"; "a,b" -> "a".
inline std::string first_slurm_host(std::string_view list) {
  std::string host;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      std::size_t j = i + 1;
      while (j < list.size() && list[j] != '-' && list[j] != ',' && list[j] != ']') host += list[j++];
      return host;
    }
    host += c;
  }
  return host;
}

}  // namespace detail

//! Reads the launcher's variables (see the file comment for the precedence) and validates them.
inline LaunchEnv detect_launch_env(const EnvLookup& env = process_env, const LaunchOverrides& over = {}) {
  LaunchEnv out;
  auto get_int = [&](std::string_view name, std::string_view hint) -> std::optional<int> {
    auto v = env(name);
    if (!v || v->empty()) return std::nullopt;
    return detail::parse_int(name, *v, hint);
  };
  // The launcher families, in precedence order: the first whose rank variable is set is the one. A field may have
  // several variables (the first one set wins).
  struct Family {
    const char *name, *rank;
    std::array<const char*, 2> size, local_rank, local_size;
    const char* hint;
    bool local_rank_defaults_to_rank, needs_master_port, mpi;
  };
  static constexpr Family families[] = {
      {"torchrun",
       "RANK",
       {"WORLD_SIZE"},
       {"LOCAL_RANK"},
       {"LOCAL_WORLD_SIZE"},
       "the launcher (accel-launch, torchrun) sets it to a number",
       true,
       true,
       false},
      {"mpi",
       "OMPI_COMM_WORLD_RANK",
       {"OMPI_COMM_WORLD_SIZE"},
       {"OMPI_COMM_WORLD_LOCAL_RANK"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE"},
       "mpirun sets it to a number",
       true,
       false,
       true},
      {"mpi",
       "MV2_COMM_WORLD_RANK",
       {"MV2_COMM_WORLD_SIZE"},
       {"MV2_COMM_WORLD_LOCAL_RANK"},
       {"MV2_COMM_WORLD_LOCAL_SIZE"},
       "MVAPICH's launcher sets it to a number",
       true,
       false,
       true},
      {"mpi",
       "PMI_RANK",
       {"PMI_SIZE"},
       {"MPI_LOCALRANKID"},
       {"MPI_LOCALNRANKS"},
       "mpiexec (MPICH, Intel MPI) sets it to a number",
       true,
       false,
       true},
      {"slurm",
       "SLURM_PROCID",
       {"SLURM_NTASKS"},
       {"SLURM_LOCALID"},
       {"SLURM_NTASKS_PER_NODE"},
       "srun sets it to a number",
       false,
       false,
       false},
      {"mpi",
       "PMIX_RANK",
       {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE"},
       "the PMIx server sets it to a number",
       true,
       false,
       true},
  };
  auto first_set = [&](const std::array<const char*, 2>& names) -> const char* {
    for (const char* n : names)
      if (n && env(n) && !env(n)->empty()) return n;
    return nullptr;
  };
  std::string rank_var = "rank", size_var = "world size", local_size_var = "LOCAL_WORLD_SIZE";
  bool needs_master_port = false, mpi = false;
  for (const Family& f : families) {
    if (!env(f.rank)) continue;
    // srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE but no local variable; SLURM's own variables carry them.
    if (std::string_view(f.rank) == "PMI_RANK" && !env("MPI_LOCALRANKID") && env("SLURM_PROCID")) continue;
    out.launcher = f.name;
    out.rank = get_int(f.rank, f.hint).value_or(0);
    const char* size = first_set(f.size);
    if (!size && std::string_view(f.rank) == "PMIX_RANK")
      throw InvalidArgument(
          "accel: PMIX_RANK=" + *env(f.rank) +
          " is set, but no variable gives the number of processes: "
          "PMIx exports only the rank and its namespace; export PMIX_SIZE=<number of processes> (and, "
          "on several nodes, PMIX_LOCAL_RANK, PMIX_LOCAL_SIZE and MASTER_ADDR) to every process, or "
          "start the job with Open MPI's mpirun, srun or accel-launch");
    out.world_size = size ? get_int(size, f.hint).value_or(1) : 1;
    const char* local_rank = first_set(f.local_rank);
    out.local_rank = local_rank ? *get_int(local_rank, f.hint) : (f.local_rank_defaults_to_rank ? out.rank : 0);
    // SLURM_NTASKS_PER_NODE may read "4(x2)": the leading number is this node's count.
    if (const char* local_size = first_set(f.local_size)) {
      out.local_world_size =
          detail::parse_int(local_size, env(local_size)->substr(0, env(local_size)->find('(')), f.hint);
      local_size_var = local_size;
    } else {
      out.local_world_size = out.world_size;
    }
    rank_var = f.rank, size_var = size ? size : f.size[0];
    needs_master_port = f.needs_master_port;
    mpi = f.mpi;
    break;
  }
  if (out.launcher == "slurm") {  // the rendezvous from the job itself, unless given
    if (!env("MASTER_ADDR")) {
      if (auto nodes = env("SLURM_JOB_NODELIST") ? env("SLURM_JOB_NODELIST") : env("SLURM_NODELIST");
          nodes && !nodes->empty())
        out.master_addr = detail::first_slurm_host(*nodes);
    }
    if (!env("MASTER_PORT")) {
      if (auto job = get_int("SLURM_JOB_ID", families[2].hint)) out.master_port = 20000 + *job % 20000;
    }
  }
  if (auto a = env("MASTER_ADDR"); a && !a->empty()) out.master_addr = *a;
  if (auto s = env("TORCHELASTIC_USE_AGENT_STORE")) out.agent_store = (*s == "True" || *s == "true" || *s == "1");
  if (auto r =
          get_int("TORCHELASTIC_RESTART_COUNT", "the launcher (accel-launch, torchrun) sets it to the restart count"))
    out.restart_count = *r;
  if (auto p = get_int("MASTER_PORT", "set it to a free TCP port (1-65535) on the master node"))
    out.master_port = *p;
  else if (needs_master_port && out.world_size > 1 && !over.master_port)
    throw InvalidArgument("accel: WORLD_SIZE=" + std::to_string(out.world_size) +
                          " but MASTER_PORT is not set; set MASTER_PORT (and MASTER_ADDR) to the rendezvous "
                          "address, or start the job with accel-launch, which sets both");
  const bool several_nodes = out.world_size > 1 && out.local_world_size != out.world_size;
  const bool no_master_addr = !(env("MASTER_ADDR") && !env("MASTER_ADDR")->empty()) && !over.master_addr;
  if (mpi && several_nodes && no_master_addr)
    throw InvalidArgument(
        "accel: the MPI job spans several nodes (" + size_var + "=" + std::to_string(out.world_size) + ", " +
        local_size_var + "=" + std::to_string(out.local_world_size) +
        ") but MASTER_ADDR is not set; export MASTER_ADDR=<address of the node running rank 0, reachable "
        "from every node> to every process (Open MPI: mpirun -x MASTER_ADDR=...; MPICH, Intel MPI, "
        "MVAPICH: mpiexec -genv MASTER_ADDR ...); 127.0.0.1 works only when every process is on one node");
  if (needs_master_port && several_nodes && no_master_addr)
    throw InvalidArgument("accel: the job spans several nodes (WORLD_SIZE=" + std::to_string(out.world_size) +
                          ", LOCAL_WORLD_SIZE=" + std::to_string(out.local_world_size) +
                          ") but MASTER_ADDR is not set; set it to the address of the node running rank 0");

  // Explicit arguments win over the environment.
  bool overridden = false;
  auto apply = [&](auto& field, const auto& value) {
    if (value) field = *value, overridden = true;
  };
  apply(out.rank, over.rank);
  apply(out.world_size, over.world_size);
  apply(out.local_rank, over.local_rank);
  apply(out.local_world_size, over.local_world_size);
  apply(out.master_addr, over.master_addr);
  apply(out.master_port, over.master_port);
  if (over.rank) rank_var = "rank argument";
  if (over.world_size) size_var = "world_size argument";
  if (overridden && out.launcher == "none") out.launcher = "arguments";
  if (over.world_size && !over.local_world_size && out.launcher == "arguments") out.local_world_size = out.world_size;
  if (over.rank && !over.local_rank && out.launcher == "arguments") out.local_rank = out.rank;

  using detail::require;
  require(out.world_size >= 1, "accel: " + size_var + "=" + std::to_string(out.world_size) + " must be at least 1");
  require(out.rank >= 0 && out.rank < out.world_size,
          "accel: " + rank_var + "=" + std::to_string(out.rank) + " is out of range for " + size_var + "=" +
              std::to_string(out.world_size) + "; ranks go from 0 to " + std::to_string(out.world_size - 1));
  require(out.local_world_size >= 1 && out.local_world_size <= out.world_size,
          "accel: the local world size (" + std::to_string(out.local_world_size) + ") must be between 1 and " +
              size_var + " (" + std::to_string(out.world_size) + ")");
  require(out.local_rank >= 0 && out.local_rank < out.local_world_size,
          "accel: the local rank (" + std::to_string(out.local_rank) + ") is out of range for a local world size of " +
              std::to_string(out.local_world_size));
  require(out.master_port >= 1 && out.master_port <= 65535, "accel: MASTER_PORT=" + std::to_string(out.master_port) +
                                                                " is out of range; use a TCP port between 1 and 65535");
  require(!out.master_addr.empty(), "accel: MASTER_ADDR is empty; set it to the address of the node running rank 0");
  require(out.restart_count >= 0, "accel: TORCHELASTIC_RESTART_COUNT=" + std::to_string(out.restart_count) +
                                      " must be at least 0 (the launcher counts its restarts from 0)");
  return out;
}

}  // namespace accel
