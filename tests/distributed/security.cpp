// Security (accel/state/rendezvous/store.hpp): what a job listens on, which keys are its own, and what it does with
// values it did not write. Driven by security.sh, which starts the processes, a foreign client and the checks.
#include "harness.hpp"

#include <accel/state/rendezvous/store.hpp>

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace mp {
namespace {

// The socket inodes a process holds (its /proc/<pid>/fd links "socket:[N]").
std::set<std::string> socket_inodes(long pid) {
  std::set<std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char target[256];
    const ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    const std::string t(target, std::size_t(n));
    if (t.rfind("socket:[", 0) == 0) out.insert(t.substr(8, t.size() - 9));
  }
  ::closedir(d);
  return out;
}

// A listening TCP socket: its address (decoded from /proc/net/tcp{,6}), port and inode.
struct Listener {
  std::string addr;
  int port = 0;
  bool loopback = false;
  std::string inode;
};

// /proc/net/tcp writes each 32-bit word of the address in host (little-endian) order.
Listener decode(const std::string& local, const std::string& inode) {
  Listener l;
  const auto colon = local.find(':');
  const std::string hex = local.substr(0, colon);
  l.port = std::stoi(local.substr(colon + 1), nullptr, 16);
  l.inode = inode;
  std::vector<unsigned> bytes;
  for (std::size_t w = 0; w + 8 <= hex.size(); w += 8)
    for (int b = 3; b >= 0; --b)
      bytes.push_back(unsigned(std::stoul(hex.substr(w + std::size_t(b) * 2, 2), nullptr, 16)));
  std::ostringstream s;
  if (bytes.size() == 4) {
    s << bytes[0] << "." << bytes[1] << "." << bytes[2] << "." << bytes[3];
    l.loopback = bytes[0] == 127;
  } else {
    for (std::size_t i = 0; i < bytes.size(); i += 2) s << (i ? ":" : "") << std::hex << (bytes[i] << 8 | bytes[i + 1]);
    const bool v6_loopback =
        std::all_of(bytes.begin(), bytes.end() - 1, [](unsigned b) { return b == 0; }) && bytes.back() == 1;
    const bool mapped_loopback = std::all_of(bytes.begin(), bytes.begin() + 10, [](unsigned b) { return b == 0; }) &&
                                 bytes[10] == 0xff && bytes[11] == 0xff && bytes[12] == 127;
    l.loopback = v6_loopback || mapped_loopback;
  }
  l.addr = s.str();
  return l;
}

std::vector<Listener> listeners() {
  std::vector<Listener> out;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
      if (st == "0A") out.push_back(decode(local, inode));  // TCP_LISTEN
    }
  }
  return out;
}

}  // namespace

// Every socket that a process of this job (its ranks and their launcher) listens on is a loopback one, and the
// rendezvous store is among them (MASTER_PORT).
void listening_surface(const Args&) {
  accel::ProcessState state(options(30000));
  tally.rank = state.process_index();
  const int N = state.num_processes();
  // Every rank's pid and its parent's (the launcher, when accel-launch started it), gathered by a sum.
  auto pids = at::zeros({2 * N}, at::kLong);
  pids[2 * tally.rank] = long(::getpid());
  pids[2 * tally.rank + 1] = long(::getppid());
  state.comm()->all_reduce(pids);
  std::set<std::string> inodes;
  for (int i = 0; i < 2 * N; ++i)
    for (const auto& s : socket_inodes(pids[i].item<long>())) inodes.insert(s);
  const int master_port = std::stoi(std::getenv("MASTER_PORT"));
  int ours = 0;
  bool store_seen = false;
  for (const auto& l : listeners()) {
    if (!inodes.count(l.inode)) continue;
    ++ours;
    store_seen = store_seen || l.port == master_port;
    check(l.loopback, "a process of the job listens on " + l.addr + ":" + std::to_string(l.port) + ", not on loopback");
  }
  check(store_seen,
        "the rendezvous store (port " + std::to_string(master_port) + ") is among the job's listening sockets");
  if (tally.rank == 0) std::cout << "listening sockets of the job: " << ours << ", all on loopback" << std::endl;
  auto t = F({1.0f});
  state.comm()->all_reduce(t);
  check(t.item<float>() == float(N), "a collective after the census");
}

// A client outside the job: connects to the store at 127.0.0.1:PORT and, for SECONDS, overwrites every key of
// every job it finds (arrival, heartbeat, engine addresses) with values of its own, and writes failures for them.
void foreign_writer(const Args& args) {
  const int port = std::stoi(arg(args, 0, "0"));
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int(std::stod(arg(args, 1, "5")) * 1000));
  c10::intrusive_ptr<c10d::TCPStore> store;
  while (!store && std::chrono::steady_clock::now() < until) {
    try {
      store = accel::rendezvous::connect_store("127.0.0.1", port, std::chrono::milliseconds(500));
    } catch (const std::exception&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  check(bool(store), "the foreign client reached the store");
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  int written = 0;
  std::set<std::string> jobs;
  while (store && std::chrono::steady_clock::now() < until) {
    try {
      for (const auto& k : store->listKeys()) {
        if (k.rfind("accel/", 0) != 0) continue;
        jobs.insert(k.substr(0, k.find('/', 6)));  // accel/<job>
        const bool beat = k.find("/beat/") != std::string::npos;
        store->set(k, bytes(beat ? "999999 1\n" : k.find("gloo") != std::string::npos ? "10.99.99.99:1" : "1"));
        ++written;
      }
      for (const auto& j : jobs)
        for (int r = 0; r < 4; ++r) {
          store->set(j + "/0/beat/" + std::to_string(r), bytes("999999 1\n"));  // "rank r failed"
          store->set("accel-launch/" + j.substr(6) + "/0/failed", bytes(std::to_string(r) + " 137 0 forged"));
          written += 2;
        }
    } catch (const std::exception&) {
      break;  // the job ended and its store with it
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::cout << "foreign client: wrote " << written << " values into " << jobs.size() << " job(s)" << std::endl;
  check(written > 0, "the foreign client wrote into the job's keys");
}

// A job under attack: collectives for SECONDS, every result checked.
void attacked_job(const Args& args) {
  accel::ProcessState state(options(60000));
  tally.rank = state.process_index();
  const int N = state.num_processes();
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int(std::stod(arg(args, 0, "3")) * 1000));
  // Every round's last element says whether this rank's time is up: all ranks stop after the same round.
  int rounds = 0;
  for (bool stop = false; !stop && rounds < 100000; ++rounds) {
    auto t = at::full({65}, double(tally.rank + 1 + rounds), at::kDouble);
    t[64] = std::chrono::steady_clock::now() >= until ? 1.0 : 0.0;
    state.comm()->all_reduce(t);
    const double want = double(N) * (N + 1) / 2 + double(N) * rounds;
    if (t[0].item<double>() != want || t[63].item<double>() != want) {
      check(false, "all_reduce round " + std::to_string(rounds));
      return;
    }
    stop = t[64].item<double>() > 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  check(rounds > 10, "the job ran collectives under attack (" + std::to_string(rounds) + " rounds)");
  if (tally.rank == 0)
    std::cout << "attacked job: " << rounds << " rounds of all_reduce, every result right" << std::endl;
}

// One job of two sharing a store: an all_reduce of VALUE must give VALUE * N (another job's ranks never join).
void job_sum(const Args& args) {
  const double value = std::stod(arg(args, 0, "1"));
  accel::ProcessState state(options(30000));
  tally.rank = state.process_index();
  const int N = state.num_processes();
  for (int i = 0; i < 20; ++i) {
    auto t = at::full({4}, value + i, at::kDouble);
    state.comm()->all_reduce(t);
    check(t[0].item<double>() == (value + i) * N, "job " + std::string(std::getenv("ACCEL_JOB_ID")) + ": all_reduce " +
                                                      std::to_string(i) + " gave " +
                                                      std::to_string(t[0].item<double>()));
  }
}

// Hosts a bare store on 127.0.0.1:PORT for SECONDS (the agent store two jobs share).
void store_host(const Args& args) {
  auto store = accel::rendezvous::host_store("127.0.0.1", std::stoi(arg(args, 0, "0")), std::chrono::seconds(30));
  std::this_thread::sleep_for(std::chrono::milliseconds(int(std::stod(arg(args, 1, "10")) * 1000)));
  mark("hosted the store for " + arg(args, 1, "10") + " s");
}

}  // namespace mp
