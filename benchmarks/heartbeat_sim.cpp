// The frozen-peer watch at scale, simulated on one machine: N ranks, each running the real rendezvous, heartbeat
// and watch (state/rendezvous/rendezvous.hpp, state/rendezvous/heartbeat.hpp, Communicator::await) against one real
// TCPStore, no engine. The ranks live as threads in a few processes; the rank that freezes lives alone in a process of
// its own, which receives SIGSTOP (its heartbeat stops, its connections stay open: Note [Frozen peers]).
//
// Timeline, after every rank has met (all times from the common start t0):
//   idle      [0, 2 s)                       the ranks beat, nobody waits
//   watched   [2 s, 2 s + K x collective)    K collectives that last `collective` (2 s) on every rank: each is
//                                            watched after 1 s; any error here is a false report
//   frozen    from freeze = watched end + 0.5 s: the frozen rank's process is stopped, and every other rank
//                                            enters a collective that only the watch can end (load and ages are
//                                            measured until two heartbeats before a peer timeout: before anyone
//                                            can name it)
// Measured: store requests and keys per second in each phase (StoreTraffic, every process summed), the age of
// every rank's beat key (sampled every 100 ms), false reports, and the time from the freeze to the error that
// names the frozen rank on each healthy rank (the "waited" of its message), with any other rank it names.
//
//   accel_bench_heartbeat_sim --ranks 1024 --procs 4 [--interval-ms 500 --peer-timeout-ms 5000
//                              --collective-ms 2000 --collectives 3 --frozen RANK --json out.json]
// (the frozen rank: N/2 + 1 by default; 0 freezes the aggregator, whose deputy, rank 1, takes over)
#include <accel/comm/communicator.hpp>
#include <accel/state/rendezvous/rendezvous.hpp>

#include <c10/util/Logging.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace sim {
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;
namespace comm = accel::comm;
namespace rendezvous = accel::rendezvous;

struct Params {
  int ranks = 64, procs = 4, collectives = 3;
  ms interval{500}, peer_timeout{5000}, collective{2000};
  int port = 0, first = 0, count = 0, frozen = -1;
  std::string job, secret, out, json;
  bool child = false;
};

Params parse(int argc, char** argv) {
  Params p;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("heartbeat_sim: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--ranks")
      p.ranks = std::stoi(next());
    else if (a == "--procs")
      p.procs = std::stoi(next());
    else if (a == "--collectives")
      p.collectives = std::stoi(next());
    else if (a == "--interval-ms")
      p.interval = ms(std::stoi(next()));
    else if (a == "--peer-timeout-ms")
      p.peer_timeout = ms(std::stoi(next()));
    else if (a == "--collective-ms")
      p.collective = ms(std::stoi(next()));
    else if (a == "--json")
      p.json = next();
    else if (a == "--child")
      p.child = true;
    else if (a == "--port")
      p.port = std::stoi(next());
    else if (a == "--first")
      p.first = std::stoi(next());
    else if (a == "--count")
      p.count = std::stoi(next());
    else if (a == "--frozen")
      p.frozen = std::stoi(next());
    else if (a == "--job")
      p.job = next();
    else if (a == "--secret")
      p.secret = next();
    else if (a == "--out")
      p.out = next();
    else
      throw std::runtime_error("heartbeat_sim: unknown argument " + a);
  }
  return p;
}

// The phases, in milliseconds from t0.
struct Timeline {
  long idle_end, watched_end, freeze, frozen_end, deadline;
  explicit Timeline(const Params& p)
      : idle_end(2000),
        watched_end(idle_end + p.collectives * p.collective.count()),
        freeze(watched_end + 500),
        frozen_end(freeze + std::max<long>(1000, p.peer_timeout.count() - 2 * p.interval.count())),
        deadline(freeze + p.peer_timeout.count() + 8 * p.interval.count() + 4000) {}
};

long long wall_ms() {
  return std::chrono::duration_cast<ms>(std::chrono::system_clock::now().time_since_epoch()).count();
}
// The steady-clock instant of the wall-clock time `t0 + at` (every process of the simulation shares the wall clock).
Clock::time_point at(long long t0, long offset) { return Clock::now() + ms(t0 + offset - wall_ms()); }

// An engine whose one collective lasts until a given instant, or until the watch ends it: the real
// Communicator::await (quick looks, the watch after a second, the verdicts, the census on failure).
class Waiting final : public comm::Communicator {
 public:
  using Communicator::Communicator;
  void wait_until(Clock::time_point until) {
    const comm::CollectiveId id = begin(comm::OpKind::barrier, c10::kFloat, 0);
    await(id, [&](ms slice) {
      const auto now = Clock::now();
      if (now < until) std::this_thread::sleep_for(std::min<Clock::duration>(slice, until - now));
      return Clock::now() >= until;
    });
  }
  Pending all_reduce_start(at::Tensor&) override { throw std::logic_error("not simulated"); }
  void finish(Pending&) override {}
  void all_reduce(at::Tensor&, comm::ReduceOp) override { throw std::logic_error("not simulated"); }
  void broadcast(at::Tensor&, int) override { throw std::logic_error("not simulated"); }
  std::vector<at::Tensor> all_gather(const at::Tensor&) override { throw std::logic_error("not simulated"); }
  void scatter(at::Tensor&, const std::vector<at::Tensor>&, int) override { throw std::logic_error("not simulated"); }
  void barrier() override {}
};

// Ages in 50 ms buckets.
using Histogram = std::map<long, long>;
void add(Histogram& h, Clock::duration d) { ++h[long(std::chrono::duration_cast<ms>(d).count() / 50)]; }

// The ranks named in an error message after "failed: " (the reporter's own "rank R:" prefix excluded).
std::set<int> named(const std::string& msg) {
  std::set<int> out;
  const auto from = msg.find("failed: ");
  const std::string tail = from == std::string::npos ? msg : msg.substr(from);
  static const std::regex rank(R"(rank (\d+))");
  for (std::sregex_iterator it(tail.begin(), tail.end(), rank), end; it != end; ++it) out.insert(std::stoi((*it)[1]));
  return out;
}
double waited_s(const std::string& msg) {
  static const std::regex waited(R"(waited ([0-9.]+) s)");
  std::smatch m;
  return std::regex_search(msg, m, waited) ? std::stod(m[1]) : -1.0;
}

comm::CommOptions options(const Params& p) {
  comm::CommOptions o;
  o.heartbeat_interval = p.interval;
  o.peer_timeout = p.peer_timeout;
  o.timeout = ms(600000);
  o.rendezvous_timeout = ms(600000);
  return o;
}

// ---- a child process: ranks [first, first + count) ---------------------------------------------------------------

int child(const Params& p) {
  const comm::CommOptions opt = options(p);
  std::vector<std::unique_ptr<rendezvous::Rendezvous>> rz(std::size_t(p.count));
  {
    std::vector<std::thread> meet;
    for (int i = 0; i < p.count; ++i)
      meet.emplace_back([&, i] {
        rendezvous::RendezvousSpec spec;
        spec.addr = "127.0.0.1", spec.port = p.port, spec.rank = p.first + i, spec.size = p.ranks;
        spec.host_store = false, spec.job = rendezvous::JobIdentity{p.job, p.secret};
        rz[std::size_t(i)] = std::make_unique<rendezvous::Rendezvous>(spec, opt);
        rz[std::size_t(i)]->settled();
      });
    for (auto& t : meet) t.join();
  }
  auto raw = rendezvous::connect_store("127.0.0.1", p.port, ms(600000));
  raw->set("sim/ready/" + std::to_string(p.first), std::vector<std::uint8_t>{1});
  const auto t0v = raw->get("sim/t0");
  const long long t0 = std::stoll(std::string(t0v.begin(), t0v.end()));
  const Timeline tl(p);
  const bool frozen_proc = p.frozen >= p.first && p.frozen < p.first + p.count;

  // Traffic at the phase boundaries; beat ages sampled every 100 ms.
  std::vector<rendezvous::StoreTraffic> marks;
  std::mutex marks_mu;
  std::vector<Histogram> ages(3);
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    const long bounds[] = {0, tl.idle_end, tl.watched_end, tl.freeze, tl.frozen_end};
    std::size_t next = 0;
    std::this_thread::sleep_until(at(t0, 0));
    while (!done && next < 5) {
      const auto now = Clock::now();
      if (now >= at(t0, bounds[next])) {
        std::lock_guard<std::mutex> lock(marks_mu);
        marks.push_back(rendezvous::StoreTraffic::now());
        ++next;
        continue;
      }
      // marks: 0 start, 1 idle end, 2 watched end, 3 freeze, 4 a peer timeout later; phases (0,1) (1,2) (3,4)
      const std::size_t phase = next == 1 ? 0 : next == 2 ? 1 : 2;
      if (next >= 1 && next != 3)
        for (int i = 0; i < p.count; ++i)
          if (p.first + i != p.frozen) add(ages[phase], rz[std::size_t(i)]->beat_age());
      std::this_thread::sleep_for(100ms);
    }
  });

  std::mutex mu;
  nlohmann::json false_reports = nlohmann::json::array(), names = nlohmann::json::array();
  std::vector<std::thread> ranks;
  for (int i = 0; i < p.count; ++i)
    ranks.emplace_back([&, i] {
      const int r = p.first + i;
      auto engine = std::make_unique<Waiting>(r, p.ranks, opt, rz[std::size_t(i)].get());
      std::this_thread::sleep_until(at(t0, tl.idle_end));
      for (int k = 0; k < p.collectives; ++k) {
        try {
          engine->wait_until(at(t0, tl.idle_end + (k + 1) * p.collective.count()));
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          false_reports.push_back({{"rank", r}, {"collective", k}, {"error", e.what()}});
          engine = std::make_unique<Waiting>(r, p.ranks, opt, rz[std::size_t(i)].get());
        }
      }
      if (r == p.frozen) return;  // its process is stopped at `freeze`
      std::this_thread::sleep_until(at(t0, tl.freeze));
      try {
        engine->wait_until(at(t0, tl.deadline));
        std::lock_guard<std::mutex> lock(mu);
        names.push_back({{"rank", r}, {"waited_s", -1.0}, {"named", nlohmann::json::array()}});
      } catch (const std::exception& e) {
        const std::string msg = e.what();
        std::lock_guard<std::mutex> lock(mu);
        const double thrown = std::chrono::duration<double>(Clock::now() - at(t0, tl.freeze)).count();
        names.push_back(
            {{"rank", r}, {"waited_s", waited_s(msg)}, {"thrown_s", thrown}, {"named", named(msg)}, {"error", msg}});
      }
    });
  // The frozen rank's process reports before it is stopped.
  if (frozen_proc) {
    ranks.front().join();
    std::this_thread::sleep_until(at(t0, tl.watched_end + 100));  // the sampler has marked the watched phase's end
  } else {
    for (auto& t : ranks) t.join();
  }
  done = true;
  if (!frozen_proc) sampler.join();
  nlohmann::json out;
  out["first"] = p.first, out["count"] = p.count;
  nlohmann::json traffic = nlohmann::json::array();
  std::lock_guard<std::mutex> lock(marks_mu);
  for (const auto& m : marks) traffic.push_back({m.requests, m.keys});
  out["traffic"] = traffic;
  nlohmann::json hs = nlohmann::json::array();
  for (const auto& h : ages) {
    nlohmann::json j = nlohmann::json::object();
    for (auto [b, n] : h) j[std::to_string(b)] = n;
    hs.push_back(j);
  }
  out["ages"] = frozen_proc ? nlohmann::json::array() : hs;
  out["false_reports"] = false_reports;
  out["names"] = names;
  std::ofstream(p.out) << out.dump() << "\n";
  std::fflush(nullptr);
  std::_Exit(0);  // the heartbeats of a saturated store may be mid-read: nothing to join
}

// ---- the parent: hosts the store, starts the children, freezes one, sums ---------------------------------------

struct Quantiles {
  double p50 = 0, p99 = 0, max = 0;
};
Quantiles quantiles(const Histogram& h) {
  long total = 0;
  for (auto [b, n] : h) total += n;
  Quantiles q;
  long seen = 0;
  bool got50 = false, got99 = false;
  for (auto [b, n] : h) {
    seen += n;
    const double upper = double(b + 1) * 0.05;
    if (!got50 && seen * 2 >= total) q.p50 = upper, got50 = true;
    if (!got99 && seen * 100 >= total * 99) q.p99 = upper, got99 = true;
    q.max = upper;
  }
  return q;
}

int parent(Params p, const char* self) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  const int need = 2 * p.ranks + 64;
  if (lim.rlim_cur < rlim_t(need))
    throw std::runtime_error("heartbeat_sim: " + std::to_string(p.ranks) + " ranks need " + std::to_string(need) +
                             " file descriptors; the limit is " + std::to_string(lim.rlim_cur) + " (ulimit -n)");
  auto store = rendezvous::host_store("127.0.0.1", 0, ms(600000));
  p.port = store->getPort();
  p.job = "sim-" + rendezvous::random_hex(4);
  p.secret = rendezvous::random_hex(16);
  if (p.frozen < 0 || p.frozen >= p.ranks) p.frozen = p.ranks / 2 + 1 < p.ranks ? p.ranks / 2 + 1 : p.ranks - 1;
  const std::string dir = "/tmp/accel-heartbeat-sim-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);

  // Blocks of ranks; the frozen rank alone.
  std::vector<std::pair<int, int>> blocks;
  {
    std::vector<int> others;
    for (int r = 0; r < p.ranks; ++r)
      if (r != p.frozen) others.push_back(r);
    const int per = (int(others.size()) + p.procs - 1) / p.procs;
    for (std::size_t i = 0; i < others.size();) {
      const int first = others[i];
      int n = 0;
      while (i < others.size() && n < per && others[i] == first + n) ++i, ++n;
      blocks.emplace_back(first, n);
    }
    blocks.emplace_back(p.frozen, 1);
  }
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  for (auto [first, n] : blocks) {
    const std::string out = dir + "/" + std::to_string(first) + ".json";
    outs.push_back(out);
    std::vector<std::string> args = {self,
                                     "--child",
                                     "--port",
                                     std::to_string(p.port),
                                     "--first",
                                     std::to_string(first),
                                     "--count",
                                     std::to_string(n),
                                     "--frozen",
                                     std::to_string(p.frozen),
                                     "--ranks",
                                     std::to_string(p.ranks),
                                     "--interval-ms",
                                     std::to_string(p.interval.count()),
                                     "--peer-timeout-ms",
                                     std::to_string(p.peer_timeout.count()),
                                     "--collective-ms",
                                     std::to_string(p.collective.count()),
                                     "--collectives",
                                     std::to_string(p.collectives),
                                     "--job",
                                     p.job,
                                     "--secret",
                                     p.secret,
                                     "--out",
                                     out};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("posix_spawn failed");
    pids.push_back(pid);
  }
  const auto m0 = Clock::now();
  std::vector<std::string> ready;
  for (auto [first, n] : blocks) ready.push_back("sim/ready/" + std::to_string(first));
  store->wait(ready, ms(600000));
  const double meet_s = std::chrono::duration<double>(Clock::now() - m0).count();
  const long long t0 = wall_ms() + 1000;
  const std::string t0s = std::to_string(t0);
  store->set("sim/t0", std::vector<std::uint8_t>(t0s.begin(), t0s.end()));
  const Timeline tl(p);
  std::this_thread::sleep_until(at(t0, tl.freeze));
  ::kill(pids.back(), SIGSTOP);
  for (std::size_t i = 0; i + 1 < pids.size(); ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
  }
  ::kill(pids.back(), SIGKILL);
  ::waitpid(pids.back(), nullptr, 0);

  // Sum.
  double req[3] = {}, keys[3] = {};
  Histogram ages[3];
  long false_reports = 0, healthy = 0, named_right = 0, named_others = 0, unnamed = 0;
  std::vector<double> waits;
  std::string example_false, example_name;
  for (const auto& path : outs) {
    std::ifstream in(path);
    nlohmann::json j;
    in >> j;
    const auto& t = j["traffic"];
    for (std::size_t ph = 0; ph < 3; ++ph) {
      const std::size_t a = ph < 2 ? ph : 3;  // the phases' marks: (0,1) (1,2) (3,4)
      if (a + 1 >= t.size()) continue;        // the frozen rank's process stops counting at the freeze
      req[ph] += double(t[a + 1][0].get<std::uint64_t>() - t[a][0].get<std::uint64_t>());
      keys[ph] += double(t[a + 1][1].get<std::uint64_t>() - t[a][1].get<std::uint64_t>());
    }
    for (std::size_t ph = 0; ph < j["ages"].size(); ++ph)
      for (auto& [b, n] : j["ages"][ph].items()) ages[ph][std::stol(b)] += n.get<long>();
    for (const auto& f : j["false_reports"]) {
      ++false_reports;
      if (example_false.empty()) example_false = f["error"];
    }
    for (const auto& n : j["names"]) {
      ++healthy;
      const auto who = n["named"].get<std::set<int>>();
      if (n["waited_s"].get<double>() < 0)
        ++unnamed;
      else if (who.count(p.frozen))
        ++named_right, waits.push_back(n["waited_s"].get<double>());
      if (!who.empty() && (who.size() > 1 || !who.count(p.frozen))) ++named_others;
      if (example_name.empty() && n.contains("error")) example_name = n["error"];
    }
  }
  std::sort(waits.begin(), waits.end());
  const double secs[3] = {double(tl.idle_end) / 1000, double(tl.watched_end - tl.idle_end) / 1000,
                          double(tl.frozen_end - tl.freeze) / 1000};
  const char* phase[3] = {"idle", "watched", "frozen"};
  nlohmann::json result = {{"ranks", p.ranks},
                           {"procs", p.procs},
                           {"frozen_rank", p.frozen},
                           {"interval_ms", p.interval.count()},
                           {"peer_timeout_ms", p.peer_timeout.count()},
                           {"collective_ms", p.collective.count()},
                           {"meet_s", meet_s}};
  std::printf(
      "heartbeat simulation: %d ranks in %zu processes, heartbeat %lld ms, peer timeout %lld ms, rank %d frozen\n",
      p.ranks, blocks.size(), (long long)p.interval.count(), (long long)p.peer_timeout.count(), p.frozen);
  std::printf("  all ranks met in %.1f s\n", meet_s);
  for (int ph = 0; ph < 3; ++ph) {
    const Quantiles q = quantiles(ages[ph]);
    std::printf("  %-8s %9.0f requests/s %9.0f keys/s   beat age p50 %.2f s p99 %.2f s max %.2f s\n", phase[ph],
                req[ph] / secs[ph], keys[ph] / secs[ph], q.p50, q.p99, q.max);
    result[phase[ph]] = {{"requests_per_s", req[ph] / secs[ph]},
                         {"keys_per_s", keys[ph] / secs[ph]},
                         {"beat_age_p50_s", q.p50},
                         {"beat_age_p99_s", q.p99},
                         {"beat_age_max_s", q.max}};
  }
  const double limit = double(p.peer_timeout.count() + 2 * p.interval.count()) / 1000;
  const double first = waits.empty() ? -1 : waits.front(), last = waits.empty() ? -1 : waits.back();
  std::printf("  false reports while every rank was healthy: %ld\n", false_reports);
  std::printf(
      "  frozen rank %d named by %ld of %ld healthy ranks, after %.1f-%.1f s (goal <= %.1f s); other ranks named "
      "by %ld; not named by %ld\n",
      p.frozen, named_right, healthy, first, last, limit, named_others, unnamed);
  if (!example_false.empty()) std::printf("  a false report: %s\n", example_false.c_str());
  if (!example_name.empty()) std::printf("  an error: %s\n", example_name.c_str());
  result["false_reports"] = false_reports;
  result["healthy"] = healthy;
  result["named_frozen"] = named_right;
  result["named_others"] = named_others;
  result["not_named"] = unnamed;
  result["name_after_s"] = {{"first", first}, {"last", last}, {"goal", limit}};
  if (!p.json.empty()) std::ofstream(p.json) << result.dump(2) << "\n";
  if (!std::getenv("SIM_KEEP"))
    for (const auto& path : outs) std::remove(path.c_str());
  ::rmdir(dir.c_str());
  return 0;
}

}  // namespace sim

int main(int argc, char** argv) {
  // c10d warns once per connection that a loopback client has no host name: 2,048 lines at 1,024 ranks.
  if (!std::getenv("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 3;
  try {
    const sim::Params p = sim::parse(argc, argv);
    return p.child ? sim::child(p) : sim::parent(p, "/proc/self/exe");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
