#pragma once
//! \file
//! `Summary`: what the heartbeat's aggregator publishes once a beat about every rank (Note [The heartbeat at
//! scale] in state/rendezvous/heartbeat.hpp): which ranks are late and by how much, which failed, which collectives the
//! ranks disagree on, and the rank its launcher reported ended. A text value, sealed like every other.

#include <accel/comm/collective_id.hpp>
#include <accel/state/rendezvous/job_identity.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace accel::rendezvous {

//! One beat of the aggregator's view of the job.
struct Summary {
  //! Ranks that issued one operation under a collective's number.
  struct Variant {
    comm::CollectiveId id;   //!< the operation
    std::vector<int> ranks;  //!< the ranks that issued it
  };
  //! A rank whose beat has not changed for `age_ms` (listed from two heartbeats on).
  struct Late {
    int rank = 0;             //!< the rank
    std::int64_t age_ms = 0;  //!< how long its beat has not changed
  };
  static constexpr std::size_t kMismatches = 16;  //!< collectives listed, the earliest first (two ranks' windows)
  static constexpr std::size_t kLate = 64;        //!< late ranks listed, the oldest beats first
  static constexpr int kMaxRank = 1 << 24;        //!< ranks beyond are refused (a forged value)

  std::uint64_t round = 0;         //!< the aggregator's beat count: a summary that stops advancing is its silence
  std::optional<EndedRank> ended;  //!< the launcher's report (Note [Ended ranks])
  std::vector<Late> late;          //!< in rank order
  std::vector<int> failed;         //!< ranks whose beat says they failed
  std::vector<std::vector<Variant>> mismatches;  //!< per collective number with two variants or more

  //! "S <round>", "E <ended>", "L <rank>:<ms> ...", "F <ranks>", then "M <id>=<ranks>|<id>=<ranks>" per mismatch.
  [[nodiscard]] std::string encode() const {
    std::string out = "S ";
    out.append(std::to_string(round)).append("\nE ");
    if (ended) {  // one line, whatever the launcher's text says
      std::string e = ended->encode();
      std::replace(e.begin(), e.end(), '\n', ' ');
      out.append(e);
    }
    out.append("\nL");
    for (const auto& l : late)
      out.append(" ").append(std::to_string(l.rank)).append(":").append(std::to_string(l.age_ms));
    out.append("\nF ").append(ranks_text(failed)).append("\n");
    for (const auto& m : mismatches) {
      out.append("M ");
      for (std::size_t i = 0; i < m.size(); ++i) {
        if (i) out.append("|");
        out.append(m[i].id.encode()).append("=").append(ranks_text(m[i].ranks));
      }
      out.append("\n");
    }
    return out;
  }
  //! The summary `encode` wrote; nothing when it is not one.
  [[nodiscard]] static std::optional<Summary> decode(const std::string& text) {
    Summary s;
    std::istringstream in(text);
    std::string line;
    bool head = false;
    try {
      while (std::getline(in, line)) {
        if (line.size() < 1) continue;
        const std::string body = line.size() > 2 ? line.substr(2) : "";
        switch (line[0]) {
          case 'S':
            s.round = std::stoull(body), head = true;
            break;
          case 'E':
            if (!body.empty()) s.ended = EndedRank::decode(body);
            break;
          case 'L': {
            std::istringstream l(line.substr(1));
            std::string item;
            while (l >> item) {
              const auto colon = item.find(':');
              if (colon == std::string::npos) return std::nullopt;
              const int r = std::stoi(item.substr(0, colon));
              const long long age = std::stoll(item.substr(colon + 1));
              if (r < 0 || r >= kMaxRank || age < 0 || age > 1000000000LL)
                return std::nullopt;  // a day and more: forged
              s.late.push_back({r, age});
            }
            break;
          }
          case 'F':
            s.failed = ranks_of(body);
            break;
          case 'M': {
            std::vector<Variant> m;
            std::size_t start = 0;
            for (;;) {
              const auto bar = body.find('|', start);
              const std::string v = body.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
              const auto eq = v.find('=');
              const auto id = eq == std::string::npos ? std::nullopt : comm::CollectiveId::decode(v.substr(0, eq));
              if (!id) return std::nullopt;
              m.push_back({*id, ranks_of(v.substr(eq + 1))});
              if (bar == std::string::npos) break;
              start = bar + 1;
            }
            s.mismatches.push_back(std::move(m));
            break;
          }
          default:
            return std::nullopt;
        }
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (!head) return std::nullopt;
    return s;
  }

  //! The collectives of `published[r]` (each rank's last ones) on which two ranks differ, the earliest first.
  [[nodiscard]] static std::vector<std::vector<Variant>> differences(
      const std::vector<std::vector<comm::CollectiveId>>& published) {
    std::map<std::uint64_t, std::map<std::string, Variant>> by_seq;
    for (int r = 0; r < int(published.size()); ++r)
      for (const auto& c : published[std::size_t(r)]) {
        auto& v = by_seq[c.seq][c.encode()];
        v.id = c;
        v.ranks.push_back(r);
      }
    std::vector<std::vector<Variant>> out;
    for (auto& [seq, variants] : by_seq) {
      if (variants.size() < 2) continue;
      std::vector<Variant> m;
      for (auto& [text, v] : variants) m.push_back(std::move(v));
      out.push_back(std::move(m));
      if (out.size() == kMismatches) break;
    }
    return out;
  }

  //! "3-7,9" for {3, 4, 5, 6, 7, 9} (sorted ranks).
  [[nodiscard]] static std::string ranks_text(const std::vector<int>& ranks) {
    std::string out;
    for (std::size_t i = 0; i < ranks.size();) {
      std::size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      if (!out.empty()) out += ',';
      out += std::to_string(ranks[i]);
      if (j > i) out.append("-").append(std::to_string(ranks[j]));
      i = j + 1;
    }
    return out;
  }
  //! The ranks of a list such as "1,3,4".
  [[nodiscard]] static std::vector<int> ranks_of(const std::string& text) {
    std::vector<int> out;
    std::istringstream in(text);
    std::string part;
    while (std::getline(in, part, ',')) {
      if (part.empty()) continue;
      const auto dash = part.find('-');
      const long long a = std::stoll(part.substr(0, dash)),
                      b = dash == std::string::npos ? a : std::stoll(part.substr(dash + 1));
      if (a < 0 || b < a || b >= kMaxRank || out.size() + std::size_t(b - a + 1) > std::size_t(kMaxRank))
        throw std::out_of_range("a range of ranks");
      for (long long r = a; r <= b; ++r) out.push_back(int(r));
    }
    return out;
  }
};

}  // namespace accel::rendezvous
