#pragma once
// A seeded, deterministic mutation engine for the hostile-file campaign (tests/fuzz/campaign.cpp): given a valid
// file's bytes and a reader, it runs N mutated copies through the reader and counts what happened. Case i of a
// campaign depends only on (seed, i), so a failure is reproduced by its case number alone.
//
// Mutations: truncation (every length class: empty, a few bytes, around each structure boundary the format
// names, one short of whole, anywhere), bit flips, byte overwrites, huge declared sizes (2^62, 2^32-1, 2^63, ...
// written over a size field the format names, or anywhere), and splices (a piece of a donor file inserted,
// overwritten or joined). A format may name regions (the members of a zip archive) and a fix-up (recomputing the
// zip CRCs) so that half the mutations land inside a region and get past the format's own checksums, which would
// otherwise reject nearly everything before the parser under test sees it.
//
// Adding a format: a `Format` with its seed bytes (plus, optionally, a donor, regions, size fields and a fix-up),
// and a reader that throws the format's error; see the campaign's test cases.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace accel_test::mutate {

using Bytes = std::vector<std::uint8_t>;

//! splitmix64: small, fast, and the same sequence on every platform.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : std::size_t(next() % n); }
};

struct Region {
  std::size_t offset = 0, size = 0;
};
struct Field {  // a little-endian size or count field
  std::size_t offset = 0, width = 0;
};

struct Format {
  std::string name;
  Bytes seed;
  Bytes donor;  //!< splice material; the seed when empty
  //! Regions where mutations may be confined (then `fixup` runs); none: the whole file.
  std::function<std::vector<Region>(std::span<const std::uint8_t>)> regions;
  //! Size and count fields, targets of the huge-size mutation.
  std::function<std::vector<Field>(std::span<const std::uint8_t>)> size_fields;
  //! Repairs the format's own checksums after a mutation confined to a region.
  std::function<void(Bytes&)> fixup;
  //! Numbers inside the regions (a pickle's integers: element counts, sizes, strides, options, counters), targets
  //! of the plausible-number mutation, which then fixes up: a file from elsewhere, not damage.
  std::function<std::vector<Field>(std::span<const std::uint8_t>)> numbers = {};
};

enum Kind { truncate, bit_flip, overwrite, huge_size, splice, plausible_number, kinds };
inline const char* kind_name(int k) {
  static const char* names[] = {"truncate", "bit flip", "overwrite", "huge size", "splice", "plausible number"};
  return names[k];
}

struct Stats {
  std::size_t cases = 0, accepted = 0, rejected = 0;  //!< accepted: the reader returned; rejected: it threw as it must
  std::size_t by_kind[kinds] = {};
  std::size_t confined = 0;           //!< mutations confined to a region and fixed up
  std::vector<std::string> failures;  //!< "case i (kind): what", the first few
  std::size_t failure_count = 0;
  double seconds = 0, slowest = 0;
};

//! The mutated bytes of case `index` of a campaign with `seed`; `kind` and `confined` say what was done.
inline Bytes mutant(const Format& f, std::uint64_t seed, std::size_t index, int& kind, bool& confined) {
  Rng rng{seed ^ (0xD6E8FEB86659FD93ull * (index + 1))};
  Bytes b = f.seed;
  const Bytes& donor = f.donor.empty() ? f.seed : f.donor;
  kind = int(rng.below(kinds));
  // Where: the whole file, or one region (then fixed up), for every kind but truncation.
  Region where{0, b.size()};
  confined = false;
  if (kind != truncate && f.regions && rng.below(2) == 0) {
    const auto rs = f.regions(b);
    if (!rs.empty()) {
      where = rs[rng.below(rs.size())];
      confined = where.size > 0;
      if (!confined) where = {0, b.size()};
    }
  }
  auto pos = [&] { return where.offset + rng.below(where.size); };
  static const std::uint64_t huge[] = {~0ull,      1ull << 62,    1ull << 63,       (1ull << 32) - 1,
                                       1ull << 31, 0x7FFFFFFFull, (1ull << 62) + 1, 0x8000000000000001ull,
                                       1ull << 40};
  if (kind == plausible_number && !(f.numbers && !f.numbers(b).empty())) kind = overwrite;
  switch (kind) {
    case plausible_number: {  // one integer becomes another that a writer could have written: 0, 1, 17, -1, its
                              // neighbours, its double or half, the largest of its width
      const auto fields = f.numbers(b);
      const auto fl = fields[rng.below(fields.size())];
      std::uint64_t v = 0;
      for (std::size_t k = 0; k < fl.width; ++k) v |= std::uint64_t(b[fl.offset + k]) << (8 * k);
      const std::uint64_t mask = fl.width >= 8 ? ~0ull : (1ull << (8 * fl.width)) - 1;
      const std::uint64_t choices[] = {0, 1, 2, 3, 17, v + 1, v - 1, v * 2, v / 2, ~0ull, mask >> 1};
      v = choices[rng.below(std::size(choices))] & mask;
      for (std::size_t k = 0; k < fl.width; ++k) b[fl.offset + k] = std::uint8_t(v >> (8 * k));
      confined = true;
      break;
    }
    case truncate: {
      std::vector<std::size_t> cuts = {0, 1, 2, 3, 4, 7, 8, 15, 16, 22, 30, 46, b.size() / 2};
      for (std::size_t k = 1; k <= 8 && k <= b.size(); ++k) cuts.push_back(b.size() - k);
      if (f.regions)
        for (const auto& r : f.regions(b))
          for (std::size_t d : {r.offset, r.offset + 1, r.offset + r.size, r.offset + r.size - 1}) cuts.push_back(d);
      if (f.size_fields)
        for (const auto& fl : f.size_fields(b)) cuts.push_back(fl.offset + rng.below(fl.width + 1));
      const std::size_t cut = rng.below(3) == 0 ? rng.below(b.size()) : cuts[rng.below(cuts.size())];
      b.resize(std::min(cut, b.size() > 0 ? b.size() - 1 : 0));
      break;
    }
    case bit_flip: {
      const std::size_t flips = 1 + rng.below(rng.below(4) == 0 ? 8 : 2);
      for (std::size_t k = 0; k < flips && !b.empty(); ++k) b[pos()] ^= std::uint8_t(1u << rng.below(8));
      break;
    }
    case overwrite: {
      static const std::uint8_t interesting[] = {0x00, 0xFF, 0x7F, 0x80, 0x01, '(', ')',
                                                 '[',  ']',  '\n', 'X',  0x8d, 0x95};
      const std::size_t n = 1 + rng.below(rng.below(4) == 0 ? 16 : 4);
      const std::size_t at = pos();
      for (std::size_t k = 0; k < n && at + k < b.size(); ++k)
        b[at + k] = rng.below(2) ? interesting[rng.below(sizeof interesting)] : std::uint8_t(rng.next());
      break;
    }
    case huge_size: {
      Field fl{pos(), std::size_t(1) << rng.below(4)};  // 1, 2, 4 or 8 bytes anywhere ...
      if (f.size_fields && rng.below(4) != 0) {         // ... or over a field the format names
        const auto fields = f.size_fields(b);
        if (!fields.empty()) fl = fields[rng.below(fields.size())];
      }
      std::uint64_t v = huge[rng.below(std::size(huge))];
      if (rng.below(4) == 0) v = b.size() + rng.below(64);  // just past the end
      for (std::size_t k = 0; k < fl.width && fl.offset + k < b.size(); ++k)
        b[fl.offset + k] = std::uint8_t(v >> (8 * k));
      break;
    }
    case splice: {
      const std::size_t from = rng.below(donor.size());
      const std::size_t len = std::min(donor.size() - from, 1 + rng.below(rng.below(4) == 0 ? 256 : 16));
      const std::size_t at = pos();
      switch (rng.below(confined ? 2 : 3)) {
        case 0:  // overwrite in place (a region keeps its size, so its fix-up stays meaningful)
          for (std::size_t k = 0; k < len && at + k < where.offset + where.size; ++k) b[at + k] = donor[from + k];
          break;
        case 1: {  // a piece of this file copied over another place of it
          const std::size_t src = pos();
          for (std::size_t k = 0; k < len && at + k < where.offset + where.size && src + k < where.offset + where.size;
               ++k)
            b[at + k] = b[src + k];
          break;
        }
        default: {  // this file's head joined to the donor's tail, or a piece inserted
          if (rng.below(2)) {
            b.resize(at);
            b.insert(b.end(), donor.begin() + std::ptrdiff_t(from), donor.end());
          } else {
            b.insert(b.begin() + std::ptrdiff_t(at), donor.begin() + std::ptrdiff_t(from),
                     donor.begin() + std::ptrdiff_t(from + len));
          }
        }
      }
      break;
    }
  }
  if (confined && f.fixup) f.fixup(b);
  return b;
}

//! Runs `cases` mutants of `f` through `read` (which takes the bytes and returns, or throws). `judge` is called
//! in the catch block of every exception and returns "" when the exception is the one the format must throw,
//! else what is wrong with it; anything else (a crash, a hang) ends the test process, which is also a failure.
template <class Read, class Judge>
Stats run(const Format& f, std::size_t cases, std::uint64_t seed, Read&& read, Judge&& judge) {
  Stats s;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < cases; ++i) {
    int kind = 0;
    bool confined = false;
    const Bytes b = mutant(f, seed, i, kind, confined);
    ++s.by_kind[kind];
    s.confined += confined;
    const auto c0 = std::chrono::steady_clock::now();
    std::string wrong;
    try {
      read(std::span<const std::uint8_t>(b));
      ++s.accepted;
    } catch (...) {
      wrong = judge();
      if (wrong.empty()) ++s.rejected;
    }
    s.slowest = std::max(s.slowest, std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
    if (!wrong.empty() && s.failure_count++ < 10)
      s.failures.push_back(f.name + " case " + std::to_string(i) + " (" + kind_name(kind) +
                           (confined ? ", confined" : "") + "): " + wrong);
    ++s.cases;
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

// ---- zip archives (LibTorch's .pt files): members, CRC-32 fix-up, size fields ---------------------------------

namespace zip {
inline std::uint64_t le(std::span<const std::uint8_t> b, std::size_t at, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n && at + i < b.size(); ++i) v |= std::uint64_t(b[at + i]) << (8 * i);
  return v;
}
inline void put(Bytes& b, std::size_t at, std::size_t n, std::uint64_t v) {
  for (std::size_t i = 0; i < n && at + i < b.size(); ++i) b[at + i] = std::uint8_t(v >> (8 * i));
}
struct Member {
  std::string name;
  std::size_t central = 0, local = 0, data = 0, size = 0;
};
//! The members of a (small, non-zip64) archive as its central directory lists them; empty when it cannot be read.
inline std::vector<Member> members(std::span<const std::uint8_t> b) {
  std::vector<Member> out;
  if (b.size() < 22) return out;
  std::size_t eocd = b.size() - 22;
  while (eocd > 0 && le(b, eocd, 4) != 0x06054b50) --eocd;
  if (le(b, eocd, 4) != 0x06054b50) return out;
  std::size_t c = le(b, eocd + 16, 4);
  for (std::uint64_t e = 0, n = le(b, eocd + 10, 2); e < n && c + 46 <= b.size() && le(b, c, 4) == 0x02014b50; ++e) {
    Member m;
    const std::size_t name_len = le(b, c + 28, 2);
    m.central = c;
    m.local = le(b, c + 42, 4);
    m.size = le(b, c + 24, 4);
    if (c + 46 + name_len > b.size() || m.local + 30 > b.size()) break;
    m.name.assign(reinterpret_cast<const char*>(b.data() + c + 46), name_len);
    m.data = m.local + 30 + le(b, m.local + 26, 2) + le(b, m.local + 28, 2);
    if (m.data + m.size > b.size()) break;
    out.push_back(m);
    c += 46 + name_len + le(b, c + 30, 2) + le(b, c + 32, 2);
  }
  return out;
}
inline std::uint32_t crc32(std::span<const std::uint8_t> d) {  // zip's CRC-32 (IEEE)
  static const auto table = [] {
    std::vector<std::uint32_t> t(256);
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = ~0u;
  for (const auto x : d) c = (c >> 8) ^ table[(c ^ x) & 0xFF];
  return ~c;
}
//! Every member's CRC-32 recomputed (local header and central directory), as if the archive had been written so.
inline void fix_crcs(Bytes& b) {
  for (const auto& m : members(b)) {
    const auto crc = crc32(std::span<const std::uint8_t>(b).subspan(m.data, m.size));
    put(b, m.local + 14, 4, crc);
    put(b, m.central + 16, 4, crc);
  }
}
//! The integers of the pickles (BININT1, BININT2, BININT and 8-byte LONG1 operands), in data.pkl and constants.pkl.
inline std::vector<Field> numbers(std::span<const std::uint8_t> b) {
  std::vector<Field> out;
  for (const auto& m : members(b)) {
    if (m.name.size() < 4 || m.name.compare(m.name.size() - 4, 4, ".pkl") != 0) continue;
    for (std::size_t i = m.data, end = m.data + m.size; i < end;) {
      const std::uint8_t op = b[i++];
      std::size_t skip = 0;
      switch (op) {
        case 'K':
          out.push_back({i, 1}), skip = 1;
          break;
        case 'M':
          out.push_back({i, 2}), skip = 2;
          break;
        case 'J':
          out.push_back({i, 4}), skip = 4;
          break;
        case 0x8a:
          skip = 1 + le(b, i, 1);
          if (le(b, i, 1) == 8) out.push_back({i + 1, 8});
          break;
        case 0x8c:
        case 'C':
        case 'U':
          skip = 1 + le(b, i, 1);
          break;
        case 'X':
        case 'B':
        case 'T':
        case 0x8b:
          skip = 4 + le(b, i, 4);
          break;
        case 0x8d:
        case 0x8e:
        case 0x96:
          skip = 8 + std::size_t(le(b, i, 8));
          break;
        case 'q':
        case 'h':
        case 0x80:
          skip = 1;
          break;
        case 'r':
        case 'j':
          skip = 4;
          break;
        case 'G':
        case 0x95:
          skip = 8;
          break;
        case 'c':
          for (int lines = 0; lines < 2 && i < end; ++i) lines += b[i] == '\n';
          break;
        default:
          break;
      }
      i += skip;
    }
  }
  std::erase_if(out, [&](const Field& f) { return f.offset + f.width > b.size(); });
  return out;
}
inline std::vector<Region> regions(std::span<const std::uint8_t> b) {
  std::vector<Region> out;
  for (const auto& m : members(b)) out.push_back({m.data, m.size});
  return out;
}
//! The pickles' length prefixes and memo indices (data.pkl, constants.pkl), and the zip's own size fields.
inline std::vector<Field> size_fields(std::span<const std::uint8_t> b) {
  std::vector<Field> out;
  for (const auto& m : members(b)) {
    out.push_back({m.central + 20, 4});
    out.push_back({m.central + 24, 4});
    out.push_back({m.central + 42, 4});
    out.push_back({m.local + 18, 4});
    out.push_back({m.local + 22, 4});
    if (m.name.size() < 4 || m.name.compare(m.name.size() - 4, 4, ".pkl") != 0) continue;
    for (std::size_t i = m.data, end = m.data + m.size; i < end;) {
      const std::uint8_t op = b[i++];
      std::size_t w = 0, skip = 0;
      switch (op) {
        case 0x8c:
        case 'C':
        case 'U':
        case 0x8a:
          w = 1;
          break;
        case 'X':
        case 'B':
        case 'T':
        case 0x8b:
          w = 4;
          break;
        case 0x8d:
        case 0x8e:
        case 0x96:
          w = 8;
          break;
        case 'q':
        case 'h':
        case 'K':
        case 0x80:
          skip = 1;
          break;
        case 'r':
        case 'j':
        case 'J':
          skip = 4;
          out.push_back({i, 4});
          break;
        case 'M':
          skip = 2;
          break;
        case 'G':
        case 0x95:
          skip = 8;
          break;
        default:
          break;
      }
      if (w) {
        out.push_back({i, w});
        skip = w + std::size_t(le(b, i, w));
      }
      i += skip;
    }
  }
  return out;
}
}  // namespace zip

}  // namespace accel_test::mutate
