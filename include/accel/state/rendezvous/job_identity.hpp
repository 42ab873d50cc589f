#pragma once
//! \file
//! Who a job is on its rendezvous store (state/rendezvous/store.hpp): its id, which every key lives under, and its
//! secret, which every value is sealed with (`JobIdentity`, from the environment or the scheduler's variables), and the
//! random ids and secrets accel-launch generates.
//!
//! Note [Job keys]
//! Every key lives under `accel/<job id>/<restart generation>/` (the launcher's under `accel-launch/<job id>/`):
//! two jobs, or two attempts of one job, that meet on one port never read each other's keys. The id is
//! `ACCEL_JOB_ID` (accel-launch generates one, or takes `--job-id`), else the scheduler's (torchrun's
//! `TORCHELASTIC_RUN_ID`, SLURM's `SLURM_JOB_ID.SLURM_STEP_ID`, PMIx's namespace, PBS, LSF), else `none`.
//!
//! Note [Ended ranks]
//! A launcher knows at once when one of its processes ends (accel-launch waits on a pidfd per process); the other
//! processes of the job would learn it only from a closed connection, or from a heartbeat that stops for
//! `CommOptions::peer_timeout`. So the launcher writes the first process of a generation that ended abnormally to
//! `accel/<job id>/<generation>/ended` ("<rank> <signal> <what>", e.g. "1 9 was killed by signal 9 (Killed)"; a
//! compare-and-set: the first one stays), sealed with the job's secret like every value (Note [Authenticated keys]
//! in state/rendezvous/store.hpp). Every process's heartbeat reads it (state/rendezvous/heartbeat.hpp): every beat, and
//! from 5 ms to a tenth of a heartbeat apart while a collective of its own waits or a census runs. A rank killed by a
//! signal died without a word: a collective waiting for it is abandoned at once, and the census after a failed
//! collective names it without waiting three heartbeats (Note [Dead peers] in comm/communicator.hpp), so a restart
//! (`--max-restarts`) starts within milliseconds. A rank that exited with a code said why itself, perhaps because
//! of another rank (a survivor ending on a frozen peer): the others' own findings go first, and its report ends a
//! wait only two heartbeats after it arrived.

#include <accel/error.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace accel::rendezvous {

// ---- the job's identity ---------------------------------------------------------------------------------------

//! Who the job is on its store: the id its keys live under, and the secret its values are sealed with (empty:
//! not authenticated).
struct JobIdentity {
  std::string id = "none";  //!< the id every key lives under
  std::string secret;       //!< the secret every value is sealed with
};

//! Checks a job id: letters, digits, `.`, `_`, `-`, at most 128 characters (it becomes part of every key).
inline void check_job_id(const std::string& id, const std::string& source) {
  const bool ok = !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!ok)
    throw InvalidArgument("accel: the job id " + source + "='" + id +
                          "' is not usable in store keys; use 1-128 letters, "
                          "digits, '.', '_' or '-'");
}

//! Reads a secret file: its content without the trailing newline; refused when others than its owner may read it.
inline std::string read_secret_file(const std::string& path) {
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InvalidArgument("accel: the job secret file '" + path +
                          "' (ACCEL_JOB_SECRET_FILE) cannot be read: " + std::strerror(errno));
  if (st.st_mode & 077)
    throw InvalidArgument("accel: the job secret file '" + path + "' may be read by others than its owner (mode " +
                          [&] {
                            char b[8];
                            std::snprintf(b, sizeof b, "%03o", unsigned(st.st_mode & 0777));
                            return std::string(b);
                          }() +
                          "); chmod 600 it");
  if (st.st_size > 4096)
    throw InvalidArgument("accel: the job secret file '" + path + "' is " + std::to_string(st.st_size) +
                          " bytes; a secret is at most 4096 bytes (e.g. `openssl rand -hex 32 > file`)");
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw InvalidArgument("accel: the job secret file '" + path + "' is empty");
  return s;
}

//! The job secret from `ACCEL_JOB_SECRET` (the secret itself) or `ACCEL_JOB_SECRET_FILE` (a file holding it,
//! readable by its owner only); empty when neither is set.
template <class Env>
std::string job_secret_from(const Env& env) {
  const auto value = env("ACCEL_JOB_SECRET");
  const auto file = env("ACCEL_JOB_SECRET_FILE");
  if (value && !value->empty() && file && !file->empty())
    throw InvalidArgument("accel: both ACCEL_JOB_SECRET and ACCEL_JOB_SECRET_FILE are set; keep one");
  if (file && !file->empty()) return read_secret_file(*file);
  if (value && !value->empty()) {
    if (value->size() < 16)
      throw InvalidArgument("accel: ACCEL_JOB_SECRET is " + std::to_string(value->size()) +
                            " characters; use at least 16 (e.g. `openssl rand -hex 32`)");
    return *value;
  }
  return {};
}

//! The job id from `ACCEL_JOB_ID`, else the scheduler's (Note [Job keys]), else "none".
template <class Env>
std::string job_id_from(const Env& env) {
  auto get = [&](const char* name) -> std::string {
    const auto v = env(name);
    return v ? *v : std::string();
  };
  auto clean = [](std::string s) {  // scheduler ids may hold characters keys should not ("1234.pbs-server")
    for (char& c : s)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
    return s.substr(0, 128);
  };
  if (auto id = get("ACCEL_JOB_ID"); !id.empty()) {
    check_job_id(id, "ACCEL_JOB_ID");
    return id;
  }
  if (auto id = get("TORCHELASTIC_RUN_ID"); !id.empty() && id != "none") return clean("torchrun-" + id);
  if (auto id = get("SLURM_JOB_ID"); !id.empty()) {
    const auto step = get("SLURM_STEP_ID");
    return clean("slurm-" + id + (step.empty() ? "" : "." + step));
  }
  if (auto id = get("PMIX_NAMESPACE"); !id.empty()) return clean("pmix-" + id);
  if (auto id = get("OMPI_MCA_ess_base_jobid"); !id.empty()) return clean("ompi-" + id);
  if (auto id = get("PBS_JOBID"); !id.empty()) return clean("pbs-" + id);
  if (auto id = get("LSB_JOBID"); !id.empty()) return clean("lsf-" + id);
  return "none";
}

//! Where the keys of one attempt of a job live: `accel/<job id>/<generation>/` (Note [Job keys]).
inline std::string job_prefix(const std::string& id, int generation) {
  return "accel/" + id + "/" + std::to_string(generation) + "/";
}

//! A process of the job that ended abnormally, as its launcher reports it (Note [Ended ranks]).
struct EndedRank {
  int rank = -1;     //!< its rank
  int signal = 0;    //!< the signal that killed it; 0: it exited with a code
  std::string what;  //!< "was killed by signal 9 (Killed)", "exited with code 1"

  //! The key's name under an attempt's prefix (`job_prefix`).
  static constexpr const char* key_name = "ended";
  //! The key a launcher writes it to, for attempt `generation` of job `id`.
  [[nodiscard]] static std::string key(const std::string& id, int generation) {
    return job_prefix(id, generation) + key_name;
  }
  //! "<rank> <signal> <what>".
  [[nodiscard]] std::string encode() const { return std::to_string(rank) + " " + std::to_string(signal) + " " + what; }
  //! The value `encode` wrote; nothing when it is not one.
  [[nodiscard]] static std::optional<EndedRank> decode(const std::string& s) {
    EndedRank e;
    std::size_t a = 0, b = 0;
    try {
      e.rank = std::stoi(s, &a);
      if (a >= s.size() || s[a] != ' ') return std::nullopt;
      e.signal = std::stoi(s.substr(a + 1), &b);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    const std::size_t at = a + 1 + b;
    if (e.rank < 0 || e.signal < 0 || at + 1 >= s.size() || s[at] != ' ') return std::nullopt;
    e.what = s.substr(at + 1, 200);  // it ends up in error messages
    return e;
  }
};

//! `bytes` random bytes from the kernel, as hex (job ids and secrets that accel-launch generates).
inline std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> b(bytes);
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  const bool ok = f && std::fread(b.data(), 1, b.size(), f) == b.size();
  if (f) std::fclose(f);
  if (!ok) throw Error("accel: cannot read /dev/urandom to generate a job id or secret");
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) out += digits[c >> 4], out += digits[c & 15];
  return out;
}

}  // namespace accel::rendezvous
