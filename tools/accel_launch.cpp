// accel-launch: starts N processes of any program on this node with the variables of torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT), prefixes every
// output line with its rank, forwards SIGINT/SIGTERM (then stops the processes after --stop-grace) and SIGUSR1/SIGUSR2
// (nothing more: a job with Options::preemption saves and exits by itself), and fails fast: when one process exits
// non-zero, the others are stopped and that exit code is returned (128 + signal for a process killed by a signal).
//
// The launcher of node rank 0 hosts the job's rendezvous store (a c10d TCPStore at MASTER_PORT; its workers connect
// to it, TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun). It listens on loopback for a job on one node, and on
// the --master-addr interface alone for several (accel/state/rendezvous/listen.hpp, Note [Listening surface]). The job
// has an id
// (--job-id, ACCEL_JOB_ID, the scheduler's, or generated) and, when ACCEL_JOB_SECRET / ACCEL_JOB_SECRET_FILE is set
// or the job runs on one node (a secret is generated then), a secret that seals every value written to the store;
// both reach the processes as ACCEL_JOB_ID and ACCEL_JOB_SECRET (Notes [Job keys], [Authenticated keys]).
// The launchers of the other nodes join it and meet there (`accel-launch/<job>/join/<node>`: every node must run the
// same --nnodes, --nproc-per-node and --max-restarts). They exchange what happens through it, under keys apart from
// the workers' ("accel/<job>/<generation>/..."):
//   accel-launch/<job>/<generation>/failed      the first failure of that generation: "<rank> <code> <node> <what>"
//                                               (compare-and-set: the first one wins); every launcher polls it (200 ms)
//                                               and stops its processes, or restarts them while restarts remain
//                                               (--max-restarts: every launcher restarts its group together, into
//                                               generation + 1);
//   accel-launch/<job>/<generation>/done/<node> this node's processes all exited 0; the job succeeds when every node's
//   has; accel-launch/<job>/stop                     a launcher was interrupted (SIGINT/SIGTERM): every launcher stops;
//   accel-launch/<job>/left                     launchers of nodes > 0 that are done with the store; node 0 (the host)
//                                               waits for them before it ends, so nobody loses the store before reading
//                                               the outcome.
//   accel-launch/job                            the job id node 0 generated, when the nodes were given none.
// and one under the processes' keys: accel/<job>/<generation>/ended, the first process of that generation that ended
// abnormally, written the moment its launcher sees it end (a pidfd per process wakes the launcher's poll); the
// processes' heartbeats read it, so that a collective waiting for that rank is abandoned at once (Note [Ended
// ranks] in accel/state/rendezvous/job_identity.hpp).
#include <accel/state/launch_env.hpp>
#include <accel/state/rendezvous/store.hpp>

#include <CLI/CLI.hpp>

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// When the launcher started (ACCEL_STORE_TRAFFIC's times).
const auto g_started = std::chrono::steady_clock::now();
volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }
// SIGUSR1 / SIGUSR2 (SLURM's --signal=USR1@<seconds> before a requeue) are forwarded to every process and end
// nothing by themselves: a job with Options::preemption saves a checkpoint and exits on its own.
volatile sig_atomic_t g_forward = 0;
void on_forward(int sig) { g_forward = sig; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;
  int exit_fd = -1;  // a pidfd: readable once the process has ended (-1: none, the poll's timeout finds it)
  std::string out_buf, err_buf;
  bool running = true;
  int status = 0;
};

// Writes complete lines of `buf` with the rank prefix; keeps a trailing partial line unless `flush`.
void emit(std::string& buf, int rank, FILE* to, bool prefix, bool flush) {
  std::size_t start = 0, nl;
  while ((nl = buf.find('\n', start)) != std::string::npos) {
    if (prefix) std::fprintf(to, "[%d] ", rank);
    std::fwrite(buf.data() + start, 1, nl - start + 1, to);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flush && !buf.empty()) {
    if (prefix) std::fprintf(to, "[%d] ", rank);
    std::fwrite(buf.data(), 1, buf.size(), to);
    std::fputc('\n', to);
    buf.clear();
  }
  std::fflush(to);
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe(int status) {
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

std::string seconds(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

// Whether something accepts TCP connections at host:port before `deadline` (tried every 200 ms). c10d's own connect
// loop may overrun its timeout by a few retries; this one keeps to the deadline.
bool reachable(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  for (;;) {
    addrinfo* found = nullptr;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) == 0) {
      for (addrinfo* a = found; a; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          int err = 0;
          socklen_t len = sizeof err;
          ok = ::poll(&p, 1, 500) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
        }
        ::close(fd);
        if (ok) {
          ::freeaddrinfo(found);
          return true;
        }
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(200ms);
  }
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

//! A failure of one generation, as the store holds it: "<rank> <code> <node> <what>".
struct Failure {
  int rank = -1, code = 1, node = 0;
  std::string what;  // "was killed by signal 9 (Killed)"
  [[nodiscard]] std::string encode() const {
    return std::to_string(rank) + " " + std::to_string(code) + " " + std::to_string(node) + " " + what;
  }
  static Failure decode(const std::string& s) {
    Failure f;
    std::istringstream is(s);
    is >> f.rank >> f.code >> f.node;
    std::getline(is >> std::ws, f.what);
    return f;
  }
};

struct Settings {
  int nproc = 1, nnodes = 1, node_rank = 0, max_restarts = 0;
  std::string master_addr = "127.0.0.1";
  int port = 0;
  std::string job_id;  // empty: ACCEL_JOB_ID, the scheduler's, or generated
  std::string secret;  // empty: none (several nodes without ACCEL_JOB_SECRET)
  double grace = 0, join_timeout = 300;
  double stop_grace = 30;  // after a forwarded SIGINT/SIGTERM, before SIGTERM again and SIGKILL 5 s later
  bool prefix = true;
  std::vector<std::string> command;
};

//! What became of one generation of this node's processes.
struct Outcome {
  enum Kind { success, failure, stopped, store_lost } kind = success;
  int code = 0;
};

class Launcher {
 public:
  explicit Launcher(Settings s) : s_(std::move(s)) {}

  int main() {
    if (!join()) return 1;  // signals end the launcher until its processes exist
    traffic("after the meeting");
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    struct sigaction fwd {};
    fwd.sa_handler = on_forward;
    ::sigaction(SIGUSR1, &fwd, nullptr);
    ::sigaction(SIGUSR2, &fwd, nullptr);
    if (mismatch_) return finish(2);
    for (int generation = 0;; ++generation) {
      if (g_signal) return finish(128 + g_signal);
      const Outcome o = run(generation);
      switch (o.kind) {
        case Outcome::success:
          return finish(0);
        case Outcome::stopped:
          return finish(o.code);
        case Outcome::store_lost:
          return o.code;
        case Outcome::failure:
          if (g_signal) return finish(o.code);  // interrupted: no restart
          if (generation < s_.max_restarts) {
            say("restarting every process (restart " + std::to_string(generation + 1) + " of --max-restarts " +
                std::to_string(s_.max_restarts) + "; TORCHELASTIC_RESTART_COUNT=" + std::to_string(generation + 1) +
                ")");
            continue;
          }
          if (s_.max_restarts > 0)
            say("no restart left (--max-restarts " + std::to_string(s_.max_restarts) + "); ending with exit code " +
                std::to_string(o.code));
          return finish(o.code);
      }
    }
  }

 private:
  // ---- the store ----------------------------------------------------------------------------------------------
  [[nodiscard]] std::string where() const { return s_.master_addr + ":" + std::to_string(s_.port); }
  [[nodiscard]] std::string key(const std::string& what) const { return "accel-launch/" + s_.job_id + "/" + what; }
  [[nodiscard]] std::string failed_key(int g) const { return key(std::to_string(g) + "/failed"); }
  [[nodiscard]] std::string done_key(int g, int node) const {
    return key(std::to_string(g) + "/done/" + std::to_string(node));
  }
  [[nodiscard]] std::string join_key(int node) const { return key("join/" + std::to_string(node)); }

  // ACCEL_STORE_TRAFFIC=1: the launcher's store requests so far (what it costs the store: benchmarks/README.md).
  void traffic(const char* when) const {
    const char* v = std::getenv("ACCEL_STORE_TRAFFIC");
    if (!v || std::string(v) != "1") return;
    const auto t = accel::rendezvous::StoreTraffic::now();
    say("store traffic " + std::string(when) + ": " + std::to_string(t.requests) + " requests, " +
        std::to_string(t.keys) + " keys in " +
        std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - g_started).count()) + " s");
  }
  void say(const std::string& what) const {
    std::fprintf(stderr, "accel-launch: %s%s\n",
                 s_.nnodes > 1 ? ("node " + std::to_string(s_.node_rank) + ": ").c_str() : "", what.c_str());
    std::fflush(stderr);
  }

  // Node 0 hosts the store; the others connect to it. Then every launcher announces itself and waits for all.
  bool join() {
    const auto t0 = Clock::now();
    const auto timeout = std::chrono::milliseconds(int64_t(s_.join_timeout * 1000));
    try {
      if (s_.node_rank != 0 && !reachable(s_.master_addr, s_.port, t0 + timeout))
        throw std::runtime_error("nothing listens there");
      auto tcp = s_.node_rank == 0 ? accel::rendezvous::host_store(s_.master_addr, s_.port, timeout)
                                   : accel::rendezvous::connect_store(s_.master_addr, s_.port, timeout);
      s_.port = tcp->getPort();  // the port chosen when --master-port was left out
      store_ = c10::make_intrusive<accel::rendezvous::JobStore>(
          tcp, s_.secret,
          "accel-launch" + (s_.nnodes > 1 ? " (node " + std::to_string(s_.node_rank) + ")" : std::string()));
    } catch (const std::exception& e) {
      store_.reset();
      if (s_.node_rank == 0)
        say("cannot host the rendezvous store at " + where() + " (" + first_line(e.what()) +
            "); choose a free --master-port, and a --master-addr of this host");
      else
        say("could not reach the rendezvous store of node 0 at " + where() + " within " + seconds(s_.join_timeout) +
            ": start accel-launch --node-rank 0 on the node of --master-addr (its launcher hosts the store), and give "
            "every "
            "node the same --master-addr and --master-port (or raise --join-timeout)");
      return false;
    }
    if (s_.nnodes == 1) return true;
    if (s_.job_id.empty()) {  // node 0 draws the id and the others take it
      try {
        if (s_.node_rank == 0) store_->set("accel-launch/job", bytes(accel::rendezvous::random_hex(16)));
        s_.job_id = text(store_->get("accel-launch/job"));
        accel::rendezvous::check_job_id(s_.job_id, "published by node 0");
      } catch (const std::exception& e) {
        say("could not agree on a job id with node 0 at " + where() + " (" + first_line(e.what()) +
            "); give every node "
            "the same --job-id");
        return false;
      }
    }
    const std::string config = "--nnodes " + std::to_string(s_.nnodes) + " --nproc-per-node " +
                               std::to_string(s_.nproc) + " --max-restarts " + std::to_string(s_.max_restarts);
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    const std::string me = config + "|" + host + ":" + std::to_string(::getpid());
    std::vector<std::string> keys;
    for (int n = 0; n < s_.nnodes; ++n) keys.push_back(join_key(n));
    try {
      if (const auto held = text(store_->compareSet(join_key(s_.node_rank), {}, bytes(me))); held != me) {
        say("another launcher (" + held.substr(held.find('|') + 1) + ") already joined as --node-rank " +
            std::to_string(s_.node_rank) + "; give every node its own --node-rank, 0 to " +
            std::to_string(s_.nnodes - 1));
        mismatch_ = true;
        return true;
      }
      bool all = store_->check(keys);
      while (!all && Clock::now() - t0 < timeout) {
        std::this_thread::sleep_for(100ms);
        all = store_->check(keys);
      }
      if (!all) {
        std::string missing;
        int joined = 0;
        for (int n = 0; n < s_.nnodes; ++n) {
          if (store_->check({join_key(n)}))
            ++joined;
          else
            missing += (missing.empty() ? "" : ", ") + std::to_string(n);
        }
        say("only " + std::to_string(joined) + " of " + std::to_string(s_.nnodes) + " nodes joined within " +
            seconds(s_.join_timeout) + "; missing node rank(s): " + missing + ". Start accel-launch --nnodes " +
            std::to_string(s_.nnodes) + " --node-rank <r> --master-addr <address of node 0> --master-port " +
            std::to_string(s_.port) + " on every node (or raise --join-timeout)");
        return false;
      }
      for (int n = 0; n < s_.nnodes; ++n) {
        const std::string theirs = text(store_->get(join_key(n)));
        if (theirs.substr(0, theirs.find('|')) != config) {
          say("node " + std::to_string(n) + " was started with " + theirs.substr(0, theirs.find('|')) +
              ", this node with " + config +
              "; start every node with the same --nnodes, --nproc-per-node and --max-restarts");
          mismatch_ = true;
          return true;
        }
      }
    } catch (const std::exception& e) {
      say("lost the rendezvous store at " + where() + " while the nodes joined (" + first_line(e.what()) + ")");
      store_.reset();
      return false;
    }
    store_->setTimeout(30s);
    return true;
  }

  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

  // Ends the job: the launchers of nodes > 0 tell node 0 they are done with the store; node 0 waits for them
  // (bounded) so that its store outlives their last look at it.
  int finish(int code) {
    const int c = leave(code);
    traffic("at the end");
    return c;
  }
  // Nodes > 0 say they are done with the store; node 0, its host, waits for them (bounded).
  int leave(int code) {
    if (s_.nnodes == 1 || !store_) return code;
    try {
      if (s_.node_rank != 0) {
        store_->add(key("left"), 1);
        return code;
      }
      const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t((s_.grace + 15) * 1000));
      while (store_->add(key("left"), 0) < s_.nnodes - 1 && Clock::now() < deadline) std::this_thread::sleep_for(50ms);
    } catch (const std::exception&) {
    }
    return code;
  }

  // Records this node's failure unless another came first; returns the generation's failure. The processes learn
  // it first, under their own keys (Note [Ended ranks]): a collective waiting for the rank that ended is abandoned.
  // `signal`: the one that killed the process (0: it exited with a code, or never started).
  Failure report(int generation, const Failure& mine, int signal = 0) {
    if (!store_) return mine;
    try {
      store_->compareSet(accel::rendezvous::EndedRank::key(s_.job_id, generation), {},
                         bytes(accel::rendezvous::EndedRank{mine.rank, signal, mine.what}.encode()));
      return Failure::decode(text(store_->compareSet(failed_key(generation), {}, bytes(mine.encode()))));
    } catch (const std::exception&) {
      return mine;
    }
  }

  // ---- one generation of this node's processes ------------------------------------------------------------------
  std::vector<std::string> environment(int local, int generation) const {
    const int rank = s_.node_rank * s_.nproc + local;
    const std::vector<std::pair<std::string, std::string>> ours = {
        {"RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(s_.nproc * s_.nnodes)},
        {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", std::to_string(s_.nproc)},
        {"GROUP_RANK", std::to_string(s_.node_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(s_.nnodes)},
        {"MASTER_ADDR", s_.master_addr},
        {"MASTER_PORT", std::to_string(s_.port)},
        {"TORCHELASTIC_USE_AGENT_STORE", "True"},  // this launcher hosts the store: rank 0 connects to it
        {"TORCHELASTIC_RESTART_COUNT", std::to_string(generation)},
        {"TORCHELASTIC_MAX_RESTARTS", std::to_string(s_.max_restarts)},
        {"ACCEL_JOB_ID", s_.job_id},
    };
    // The secret reaches the processes as a value (readable by this user only, in /proc/<pid>/environ).
    const std::vector<std::string> dropped = {"ACCEL_JOB_SECRET", "ACCEL_JOB_SECRET_FILE"};
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string_view kv(*e);
      const auto name = kv.substr(0, kv.find('='));
      if (std::none_of(ours.begin(), ours.end(), [&](const auto& p) { return p.first == name; }) &&
          std::find(dropped.begin(), dropped.end(), name) == dropped.end())
        env.emplace_back(kv);
    }
    for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
    if (!s_.secret.empty()) env.push_back("ACCEL_JOB_SECRET=" + s_.secret);
    return env;
  }

  // Forks one process. Everything it needs is prepared before the fork (the store's threads run in this process):
  // the child only redirects its output and calls exec.
  bool spawn(Child& c, int local, int generation) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      std::perror("accel-launch: pipe");
      return false;
    }
    auto env = environment(local, generation);
    std::vector<char*> envp, argv;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    auto command = s_.command;
    for (auto& a : command) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string cannot = "accel-launch: cannot run '" + command[0] + "': ";
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);                     // its own process group: stopping it reaches its children too
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      if (::getppid() != parent) ::_exit(1);
      ::dup2(out[1], STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copies
      ::dup2(err[1], STDERR_FILENO);
      ::close_range(3, ~0U, 0);  // nothing of the launcher's (its store's sockets) leaks into the program
      ::execvpe(argv[0], argv.data(), envp.data());
      const char* why = ::strerror(errno);
      [[maybe_unused]] auto a = ::write(STDERR_FILENO, cannot.data(), cannot.size());
      [[maybe_unused]] auto b = ::write(STDERR_FILENO, why, std::strlen(why));
      [[maybe_unused]] auto n = ::write(STDERR_FILENO, "\n", 1);
      ::_exit(127);
    }
    ::close(out[1]), ::close(err[1]);
    if (pid < 0) {
      std::perror("accel-launch: fork");
      ::close(out[0]), ::close(err[0]);
      return false;
    }
    ::setpgid(pid, pid);  // also here: a stop sent before the child ran its own setpgid still reaches its group
    c = Child{s_.node_rank * s_.nproc + local, pid, out[0], err[0]};
    // The poll wakes the moment the process ends, not at its next timeout: the others learn it within
    // milliseconds (Note [Ended ranks]). Linux 5.3 and later; without it the 100 ms poll finds the exit.
    c.exit_fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (c.exit_fd >= 0) ::fcntl(c.exit_fd, F_SETFD, FD_CLOEXEC);
    return true;
  }

  Outcome run(int generation) {
    std::vector<Child> children(static_cast<std::size_t>(s_.nproc));
    std::optional<Failure> failure;  // this generation's first failure (here or on another node)
    std::optional<Outcome> stop;     // interrupted, or the store is gone
    for (int i = 0; i < s_.nproc; ++i) {
      if (!spawn(children[std::size_t(i)], i, generation)) {
        children.resize(std::size_t(i));
        failure = report(generation, {s_.node_rank * s_.nproc + i, 1, s_.node_rank, "could not be started"});
        break;
      }
    }
    std::optional<Clock::time_point> stop_deadline, drain_deadline;
    bool terminated = false, killed = false;
    auto next_poll = Clock::now();
    auto signal_all = [&](int sig) {
      for (auto& c : children)
        if (c.running) ::kill(-c.pid, sig);
    };
    auto others = [&] {
      int n = 0;
      for (auto& o : children) n += o.running ? 1 : 0;
      return n;
    };
    if (failure) stop_deadline = Clock::now();
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<std::pair<Child*, bool>> who;
      for (auto& c : children) {
        if (c.out >= 0) fds.push_back(pollfd{c.out, POLLIN, 0}), who.emplace_back(&c, false);
        if (c.err >= 0) fds.push_back(pollfd{c.err, POLLIN, 0}), who.emplace_back(&c, true);
      }
      const std::size_t pipes = fds.size();
      for (auto& c : children)
        if (c.running && c.exit_fd >= 0) fds.push_back(pollfd{c.exit_fd, POLLIN, 0});
      if (!fds.empty())
        ::poll(fds.data(), fds.size(), 100);
      else
        std::this_thread::sleep_for(50ms);
      for (std::size_t k = 0; k < pipes; ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto [c, is_err] = who[k];
        char buf[65536];
        const ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
        std::string& line = is_err ? c->err_buf : c->out_buf;
        if (n > 0) {
          line.append(buf, std::size_t(n));
          emit(line, c->rank, is_err ? stderr : stdout, s_.prefix, false);
        } else {
          emit(line, c->rank, is_err ? stderr : stdout, s_.prefix, true);
          ::close(fds[k].fd);
          (is_err ? c->err : c->out) = -1;
        }
      }
      if (const int sig = g_forward) {
        g_forward = 0;
        say("received signal " + std::to_string(sig) + " (" + ::strsignal(sig) + "); forwarding it to every process");
        signal_all(sig);
      }
      if (g_signal && !terminated) {
        say("received signal " + std::to_string(int(g_signal)) + "; forwarding it to every process" +
            (s_.nnodes > 1 ? " and stopping every node" : ""));
        signal_all(g_signal);
        if (!failure && !stop) stop = Outcome{Outcome::stopped, 128 + g_signal};
        if (store_ && s_.nnodes > 1) try {
            store_->compareSet(key("stop"), {}, bytes(std::to_string(128 + g_signal)));
          } catch (const std::exception&) {
          }
        terminated = true;
        stop_deadline = Clock::now() + std::chrono::milliseconds(int64_t(s_.stop_grace * 1000));
      }
      int running = 0;
      for (auto& c : children) {
        if (!c.running) continue;
        int status = 0;
        if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
          c.running = false;
          c.status = status;
          if (c.exit_fd >= 0) ::close(c.exit_fd), c.exit_fd = -1;
          const int code = exit_code(status);
          if (code != 0 && !failure && !stop) {
            failure = report(generation, {c.rank, code, s_.node_rank, describe(status)},
                             WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            const std::string rest = others() == 0 ? std::string()
                                                   : (s_.grace > 0 ? "waiting for" : "stopping") +
                                                         std::string(" the other ") + std::to_string(others()) +
                                                         " process(es)" + (s_.nnodes > 1 ? " of this node" : "");
            if (failure->rank == c.rank && failure->node == s_.node_rank)
              say("rank " + std::to_string(c.rank) + " " + describe(status) + "; " + rest +
                  (s_.nnodes == 1 ? "" : (rest.empty() ? "" : "; ") + std::string("the other nodes stop theirs")));
            else
              say("rank " + std::to_string(failure->rank) + " on node " + std::to_string(failure->node) + " " +
                  failure->what + " (and here rank " + std::to_string(c.rank) + " " + describe(status) + ")" +
                  (rest.empty() ? "" : "; " + rest));
            stop_deadline = Clock::now() + std::chrono::milliseconds(int64_t(s_.grace * 1000));
          }
        } else {
          ++running;
        }
      }
      // What the other nodes report: a failure of this generation, an interruption, or the store gone.
      if (s_.nnodes > 1 && store_ && !failure && !stop && Clock::now() >= next_poll) {
        next_poll = Clock::now() + 200ms;
        try {
          if (store_->check({failed_key(generation)})) {
            failure = Failure::decode(text(store_->get(failed_key(generation))));
            say("rank " + std::to_string(failure->rank) + " on node " + std::to_string(failure->node) + " " +
                failure->what + "; " + (s_.grace > 0 ? "waiting for" : "stopping") + " the " +
                std::to_string(others()) + " process(es) of this node");
            stop_deadline = Clock::now() + std::chrono::milliseconds(int64_t(s_.grace * 1000));
          } else if (store_->check({key("stop")})) {
            stop = Outcome{Outcome::stopped, std::stoi(text(store_->get(key("stop"))))};
            say("another node's launcher was interrupted; stopping the " + std::to_string(others()) +
                " process(es) of this node");
            stop_deadline = Clock::now();
          }
        } catch (const std::exception& e) {
          say("lost the rendezvous store at " + where() + " (" + first_line(e.what()) +
              "): the launcher of node 0 ended; stopping the " + std::to_string(others()) +
              " process(es) of this node");
          stop = Outcome{Outcome::store_lost, 1};
          stop_deadline = Clock::now();
        }
      }
      const bool pipes_open =
          std::any_of(children.begin(), children.end(), [](const Child& c) { return c.out >= 0 || c.err >= 0; });
      if (running == 0 && !pipes_open) break;
      if (running == 0 && !drain_deadline) drain_deadline = Clock::now() + 2s;
      if (drain_deadline && Clock::now() >= *drain_deadline) break;  // a grandchild holds a pipe
      if (stop_deadline && Clock::now() >= *stop_deadline) {
        if (!terminated) {
          signal_all(SIGTERM);
          terminated = true;
          stop_deadline = Clock::now() + 5s;
        } else if (!killed) {
          signal_all(SIGKILL);
          killed = true;
        }
      }
    }
    for (auto& c : children) {  // a grandchild kept a pipe open past the drain
      if (c.out >= 0) ::close(c.out);
      if (c.err >= 0) ::close(c.err);
      if (c.exit_fd >= 0) ::close(c.exit_fd);
    }
    if (stop) return *stop;
    if (failure) return {Outcome::failure, failure->code};
    return await_others(generation);
  }

  // This node's processes all exited 0: the job succeeds when every node's did, and fails (or restarts) if
  // another node's failed.
  Outcome await_others(int generation) {
    if (s_.nnodes == 1 || !store_) return {Outcome::success, 0};
    try {
      store_->set(done_key(generation, s_.node_rank), bytes("1"));
      std::vector<std::string> done;
      for (int n = 0; n < s_.nnodes; ++n) done.push_back(done_key(generation, n));
      for (;;) {
        if (store_->check(done)) return {Outcome::success, 0};
        if (store_->check({failed_key(generation)})) {
          const Failure f = Failure::decode(text(store_->get(failed_key(generation))));
          say("rank " + std::to_string(f.rank) + " on node " + std::to_string(f.node) + " " + f.what +
              " (this node's processes had ended)");
          return {Outcome::failure, f.code};
        }
        if (store_->check({key("stop")})) return {Outcome::stopped, std::stoi(text(store_->get(key("stop"))))};
        if (g_signal) {
          store_->compareSet(key("stop"), {}, bytes(std::to_string(128 + g_signal)));
          return {Outcome::stopped, 128 + g_signal};
        }
        std::this_thread::sleep_for(200ms);
      }
    } catch (const std::exception& e) {
      say("lost the rendezvous store at " + where() + " (" + first_line(e.what()) +
          ") while waiting for the other nodes");
      return {Outcome::store_lost, 1};
    }
  }

  Settings s_;
  c10::intrusive_ptr<accel::rendezvous::JobStore> store_;  // the TCPStore, sealing values when the job has a secret
  bool mismatch_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"accel-launch: start N processes of a program with torchrun's variables; fail fast, restart on failure"};
  Settings s;
  std::optional<int> master_port;
  std::optional<std::string> master_addr;
  bool no_prefix = false;
  app.add_option("--nproc-per-node", s.nproc, "processes on this node")->check(CLI::PositiveNumber);
  app.add_option("--nnodes", s.nnodes, "nodes in the job (one accel-launch per node)")->check(CLI::PositiveNumber);
  app.add_option("--node-rank", s.node_rank, "this node's index (node 0 hosts the rendezvous store)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", master_addr,
                 "address of node 0, reachable from every node (required with --nnodes > 1)");
  app.add_option("--master-port", master_port, "rendezvous port (default: a free port; required with --nnodes > 1)")
      ->check(CLI::Range(1, 65535));
  app.add_option(
         "--max-restarts", s.max_restarts,
         "after a failure, restart every process of every node this many times (each resumes from its checkpoint)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--join-timeout", s.join_timeout,
                 "seconds the launchers of a multi-node job wait for each other (default 300)")
      ->check(CLI::PositiveNumber);
  app.add_option("--grace", s.grace,
                 "after a failure, seconds the others get to end by themselves before being stopped");
  app.add_option("--stop-grace", s.stop_grace,
                 "after forwarding SIGINT/SIGTERM, seconds the processes get to save and exit "
                 "(Options::preemption) before they are stopped (default 30, SLURM's KillWait)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--job-id", s.job_id,
                 "the job's id, under which every rendezvous key lives (default: ACCEL_JOB_ID, the "
                 "scheduler's job id, or generated; give every node the same)");
  app.add_flag("--no-prefix", no_prefix, "do not prefix output lines with the rank");
  app.add_option("command", s.command, "the program and its arguments")->required();
  app.positionals_at_end();
  CLI11_PARSE(app, argc, argv);
  if (s.node_rank >= s.nnodes) {
    std::cerr << "accel-launch: --node-rank " << s.node_rank << " must be below --nnodes " << s.nnodes << "\n";
    return 2;
  }
  if (s.nnodes > 1 && !master_addr) {
    std::cerr << "accel-launch: --nnodes " << s.nnodes << " needs --master-addr: the address of node rank 0, reachable "
              << "from every node (127.0.0.1 only works when every node is this machine)\n";
    return 2;
  }
  if (s.nnodes > 1 && !master_port) {
    std::cerr << "accel-launch: --nnodes " << s.nnodes << " needs --master-port (the same on every node: node rank 0 "
              << "hosts the rendezvous store there)\n";
    return 2;
  }
  if (master_addr) s.master_addr = *master_addr;
  if (master_port) s.port = *master_port;  // else 0: the store picks a free port
  s.prefix = !no_prefix;
  // A job on one node stays on loopback, whatever --master-addr says (Note [Listening surface]).
  if (s.nnodes == 1) s.master_addr = "127.0.0.1";
  try {
    if (!s.job_id.empty())
      accel::rendezvous::check_job_id(s.job_id, "--job-id");
    else if (std::string id = accel::rendezvous::job_id_from(accel::process_env); id != "none")
      s.job_id = id;
    else if (s.nnodes == 1)
      s.job_id = accel::rendezvous::random_hex(16);
    s.secret = accel::rendezvous::job_secret_from(accel::process_env);
  } catch (const std::exception& e) {
    std::cerr << "accel-launch: " << e.what() << "\n";
    return 2;
  }
  if (s.secret.empty() && s.nnodes == 1) s.secret = accel::rendezvous::random_hex(32);
  if (s.secret.empty())
    std::cerr << "accel-launch: warning: no ACCEL_JOB_SECRET or ACCEL_JOB_SECRET_FILE: any host that reaches "
              << s.master_addr
              << " can write this job's rendezvous keys; give every node the same secret (README, "
                 "Security)\n";

  ::signal(SIGPIPE, SIG_IGN);
  // c10d logs every retry of a connection (with a stack trace); the launcher says what went wrong itself.
  if (!std::getenv("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 3;
  return Launcher(std::move(s)).main();
}
