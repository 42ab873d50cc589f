// accel-launch: starts N processes of any program on this node with the variables of torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), prefixes every output line with its
// rank, forwards SIGINT/SIGTERM, and fails fast: when one process exits non-zero, the others are stopped
// and that exit code is returned (128 + signal for a process killed by a signal).
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;
  std::string out_buf, err_buf;
  bool running = true;
  int status = 0;
};

int free_port(const std::string& addr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  ::inet_pton(AF_INET, addr == "localhost" ? "127.0.0.1" : addr.c_str(), &sa.sin_addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    if (fd >= 0) ::close(fd);
    return 29500;
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

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
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"accel-launch: start N processes of a program with torchrun's variables; fail fast"};
  int nproc = 1, nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;
  double grace = 0;
  bool no_prefix = false;
  std::vector<std::string> command;
  app.add_option("--nproc-per-node", nproc, "processes on this node")->check(CLI::PositiveNumber);
  app.add_option("--nnodes", nnodes, "nodes in the job")->check(CLI::PositiveNumber);
  app.add_option("--node-rank", node_rank, "this node's index")->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", master_addr, "address of the node running rank 0");
  app.add_option("--master-port", master_port, "rendezvous port (default: a free port; required with --nnodes > 1)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--grace", grace, "after a failure, seconds the others get to end by themselves before being stopped");
  app.add_flag("--no-prefix", no_prefix, "do not prefix output lines with the rank");
  app.add_option("command", command, "the program and its arguments")->required();
  app.positionals_at_end();
  CLI11_PARSE(app, argc, argv);
  if (node_rank >= nnodes) {
    std::cerr << "accel-launch: --node-rank " << node_rank << " must be below --nnodes " << nnodes << "\n";
    return 2;
  }
  if (nnodes > 1 && !master_port) {
    std::cerr << "accel-launch: a job on several nodes needs --master-port (the same on every node)\n";
    return 2;
  }
  const int port = master_port ? *master_port : free_port(master_addr);
  const int world = nproc * nnodes;

  struct sigaction sa{};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<Child> children(static_cast<std::size_t>(nproc));
  for (int i = 0; i < nproc; ++i) {
    int out[2], err[2];
    if (::pipe(out) != 0 || ::pipe(err) != 0) {
      std::perror("accel-launch: pipe");
      return 1;
    }
    const int rank = node_rank * nproc + i;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);                     // its own process group: stopping it reaches its children too
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> args;
      for (auto& a : command) args.push_back(a.data());
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "accel-launch: cannot run '%s': %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    ::close(out[1]), ::close(err[1]);
    children[std::size_t(i)] = {rank, pid, out[0], err[0]};
  }

  std::optional<int> failure;  // exit code of the first process that failed
  auto stop_deadline = std::optional<std::chrono::steady_clock::time_point>();
  std::optional<std::chrono::steady_clock::time_point> drain_deadline;
  bool terminated = false, killed = false;
  auto signal_all = [&](int sig) {
    for (auto& c : children)
      if (c.running) ::kill(-c.pid, sig);
  };
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> who;
    for (auto& c : children) {
      if (c.out >= 0) fds.push_back(pollfd{c.out, POLLIN, 0}), who.emplace_back(&c, false);
      if (c.err >= 0) fds.push_back(pollfd{c.err, POLLIN, 0}), who.emplace_back(&c, true);
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto [c, is_err] = who[k];
      char buf[65536];
      const ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
      std::string& line = is_err ? c->err_buf : c->out_buf;
      if (n > 0) {
        line.append(buf, std::size_t(n));
        emit(line, c->rank, is_err ? stderr : stdout, !no_prefix, false);
      } else {
        emit(line, c->rank, is_err ? stderr : stdout, !no_prefix, true);
        ::close(fds[k].fd);
        (is_err ? c->err : c->out) = -1;
      }
    }
    if (g_signal && !terminated) {
      std::fprintf(stderr, "accel-launch: received signal %d; forwarding it to every process\n", int(g_signal));
      signal_all(g_signal);
      if (!failure) failure = 128 + g_signal;
      terminated = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
    int running = 0;
    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.running = false;
        c.status = status;
        const int code = exit_code(status);
        if (code != 0 && !failure) {
          failure = code;
          int others = 0;
          for (auto& o : children) others += o.running ? 1 : 0;
          std::fprintf(stderr, "accel-launch: rank %d %s; %s the other %d process(es)\n", c.rank, describe(status).c_str(),
                       grace > 0 ? "waiting for" : "stopping", others);
          stop_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(grace * 1000));
        }
      } else {
        ++running;
      }
    }
    const bool pipes_open = std::any_of(children.begin(), children.end(), [](const Child& c) { return c.out >= 0 || c.err >= 0; });
    if (running == 0 && !pipes_open) break;
    if (running == 0 && !drain_deadline) drain_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    if (drain_deadline && std::chrono::steady_clock::now() >= *drain_deadline) break;  // a grandchild holds a pipe
    if (stop_deadline && std::chrono::steady_clock::now() >= *stop_deadline) {
      if (!terminated) {
        signal_all(SIGTERM);
        terminated = true;
        stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      } else if (!killed) {
        signal_all(SIGKILL);
        killed = true;
      }
    }
  }
  return failure.value_or(0);
}
