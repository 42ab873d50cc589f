// The pickles of a LibTorch archive (checkpoint/pickle.hpp, Note [What a pickle can declare]): a storage that
// claims more bytes than its record, a tensor that reaches past its storage, and the unpickler's other trusted
// counts are refused before LibTorch reads them, naming the member and the storage; what LibTorch writes passes.
#include "../../support/mutate.hpp"

#include <accel/checkpoint/archive.hpp>

#include <ATen/ops/arange.h>
#include <torch/serialize/output-archive.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace ck = accel::checkpoint;
namespace zip = accel_test::mutate::zip;
using Bytes = std::vector<std::uint8_t>;

// An archive as LibTorch writes it: a float tensor [1, 4] of storage '0' (16 bytes), then a long tensor [3].
Bytes written_archive() {
  torch::serialize::OutputArchive out;
  out.write("w", at::arange(4, at::kFloat).reshape({1, 4}));
  out.write("n", at::arange(3, at::kLong));
  std::ostringstream s;
  out.save_to(s);
  const auto text = s.str();
  return Bytes(text.begin(), text.end());
}

// Where, in `archive`'s data.pkl, the first tensor's numbers are: the storage's element count (the BININT1 before
// TUPLE, BINPERSID) and, after it, the view's offset and its sizes.
struct TensorBytes {
  std::size_t numel = 0, offset = 0, size0 = 0, size1 = 0;
};
TensorBytes first_tensor(const Bytes& archive) {
  for (const auto& m : zip::members(archive)) {
    if (!m.name.ends_with("/data.pkl")) continue;
    for (std::size_t i = m.data; i + 3 < m.data + m.size; ++i)
      if (archive[i] == 'K' && archive[i + 2] == 't' && archive[i + 3] == 'Q') {
        TensorBytes t{i + 1};
        std::size_t k = i + 4;
        if (archive[k] == 'q') k += 2;  // BINPUT of the storage
        REQUIRE(archive[k] == 'K');     // the offset
        t.offset = k + 1;
        REQUIRE(archive[k + 2] == '(');  // MARK, the sizes
        REQUIRE(archive[k + 3] == 'K');
        t.size0 = k + 4;
        REQUIRE(archive[k + 5] == 'K');
        t.size1 = k + 6;
        return t;
      }
  }
  FAIL("no tensor found in data.pkl");
  return {};
}

// `archive` with the byte at `at` set to `value`, its CRCs fixed as a writer would have written them.
Bytes forged(Bytes archive, std::size_t at, std::uint8_t value) {
  archive[at] = value;
  zip::fix_crcs(archive);
  return archive;
}

std::string refusal(const Bytes& archive) {
  torch::serialize::InputArchive a;
  try {
    ck::load_archive(a, archive, "model.pt");
  } catch (const accel::FileError& e) {
    return e.what();
  }
  return "";
}

// A pickle of one tensor over storage '0' (of `numel` elements of `dtype`) with `offset`, `sizes` and `strides`.
std::string tensor_pickle(const std::string& dtype, const std::string& numel, const std::string& offset,
                          const std::string& sizes, const std::string& strides) {
  using namespace std::string_literals;
  return "\x80\x02"s + "ctorch._utils\n_rebuild_tensor_v2\n" + "((X\x07\0\0\0storage"s + dtype + "X\x01\0\0\0"s + "0" +
         "X\x03\0\0\0cpu"s + numel + "tQ" + offset + "(" + sizes + "t(" + strides + "t\x89" +
         "ccollections\nOrderedDict\n)RtR.";
}
std::string check(const std::string& pickle, std::map<std::string, std::uint64_t> records = {{"a/data/0", 16}}) {
  const ck::RecordSize size = [&](std::string_view name) -> std::optional<std::uint64_t> {
    const auto it = records.find(std::string(name));
    return it == records.end() ? std::nullopt : std::optional(it->second);
  };
  try {
    ck::check_pickle(std::span(reinterpret_cast<const std::uint8_t*>(pickle.data()), pickle.size()), "model.pt",
                     "a/data.pkl", size);
  } catch (const accel::FileError& e) {
    return e.what();
  }
  return "";
}
const std::string float_storage = "ctorch\nFloatStorage\n";
std::string pickled_int(int v) { return std::string("K") + char(v); }

}  // namespace

TEST_CASE("pickles: an archive as LibTorch writes it is read, and its tensors are whole", "[checkpoint][pickle]") {
  const auto archive = written_archive();
  CHECK(refusal(archive).empty());
  torch::serialize::InputArchive a;
  ck::load_archive(a, archive, "model.pt");
  at::Tensor w;
  a.read("w", w);
  CHECK(w.sizes() == at::IntArrayRef({1, 4}));
  CHECK(w.storage().nbytes() == 16);
  CHECK(check(tensor_pickle(float_storage, pickled_int(4), pickled_int(0), pickled_int(1) + pickled_int(4),
                            pickled_int(4) + pickled_int(1)))
            .empty());
  // An empty view may have any stride; a view of the storage's last element fits exactly.
  CHECK(check(tensor_pickle(float_storage, pickled_int(4), pickled_int(0), pickled_int(0) + pickled_int(200),
                            pickled_int(200) + pickled_int(200)))
            .empty());
  CHECK(check(tensor_pickle(float_storage, pickled_int(4), pickled_int(3), pickled_int(1), pickled_int(1))).empty());
}

TEST_CASE("pickles: a storage that claims more bytes than its record is refused before LibTorch sizes it",
          "[checkpoint][pickle]") {
  const auto archive = written_archive();
  const auto t = first_tensor(archive);
  REQUIRE(archive[t.numel] == 4);
  const auto lying = forged(archive, t.numel, 80);
  // What LibTorch alone makes of it: a storage of 320 bytes around a record of 16 (writing it overflows the heap).
  torch::serialize::InputArchive unchecked;
  unchecked.load_from(reinterpret_cast<const char*>(lying.data()), lying.size());
  at::Tensor w;
  unchecked.read("w", w);
  CHECK(w.storage().nbytes() == 320);
  const auto error = refusal(lying);
  CHECK_THAT(error, Catch::Contains("model.pt") && Catch::Contains("data.pkl") &&
                        Catch::Contains("storage '0' declares 80 elements of 4 bytes (320 bytes), its record") &&
                        Catch::Contains("holds 16 bytes"));
  // Fewer bytes than the record holds is not what LibTorch writes either.
  CHECK_THAT(refusal(forged(archive, t.numel, 2)), Catch::Contains("storage '0' declares 2 elements"));
  CHECK_THAT(check(tensor_pickle(float_storage, pickled_int(4), pickled_int(0), pickled_int(1), pickled_int(1)), {}),
             Catch::Contains("storage '0' of 16 bytes has no record a/data/0"));
}

TEST_CASE("pickles: a tensor whose offset, sizes or strides reach past its storage is refused",
          "[checkpoint][pickle]") {
  const auto archive = written_archive();
  const auto t = first_tensor(archive);
  REQUIRE(archive[t.size1] == 4);
  const std::string past = "a tensor whose offset, sizes and strides reach past its storage of 16 bytes";
  CHECK_THAT(refusal(forged(archive, t.size1, 40)), Catch::Contains(past) && Catch::Contains("model.pt"));
  CHECK_THAT(refusal(forged(archive, t.size0, 2)), Catch::Contains(past));
  CHECK_THAT(refusal(forged(archive, t.offset, 1)), Catch::Contains(past));
  CHECK_THAT(check(tensor_pickle(float_storage, pickled_int(4), pickled_int(4), pickled_int(1), pickled_int(1))),
             Catch::Contains(past));
  CHECK_THAT(check(tensor_pickle(float_storage, pickled_int(4), pickled_int(0), pickled_int(2) + pickled_int(2),
                                 pickled_int(3) + pickled_int(1))),
             Catch::Contains(past));
  // Negative strides or offsets, and products that overflow 64 bits.
  const std::string minus_one = "J\xff\xff\xff\xff";  // BININT -1
  CHECK_THAT(check(tensor_pickle(float_storage, pickled_int(4), pickled_int(0), pickled_int(4), minus_one)),
             Catch::Contains("non-negative"));
  CHECK_THAT(check(tensor_pickle(float_storage, pickled_int(4), minus_one, pickled_int(1), pickled_int(1))),
             Catch::Contains("at offset -1"));
  const std::string huge = std::string("\x8a\x08") + std::string("\0\0\0\0\0\0\0\x40", 8);  // LONG1 2^62
  CHECK_THAT(
      check(tensor_pickle(float_storage, pickled_int(4), pickled_int(0), pickled_int(2) + pickled_int(2), huge + huge)),
      Catch::Contains(past));
  CHECK_THAT(check(tensor_pickle(float_storage, huge, pickled_int(0), pickled_int(1), pickled_int(1))),
             Catch::Contains("storage '0' of"));
}

TEST_CASE("pickles: what LibTorch's unpickler trusts otherwise is refused, naming the member", "[checkpoint][pickle]") {
  const auto in_member = [](const std::string& what) { return Catch::Contains("a/data.pkl: " + what); };
  // A dtype that is no dtype (an integer where torch.<T>Storage resolves to one).
  CHECK_THAT(check(tensor_pickle(std::string("J\xe7\x03\0\0", 5), pickled_int(4), pickled_int(0), pickled_int(1),
                                 pickled_int(1))),
             in_member("storage '0' of an unknown dtype"));
  // Quantized, sparse and subclassed tensors are not read.
  CHECK_THAT(check("\x80\x02"
                   "ctorch._utils\n_rebuild_qtensor\n."),
             in_member("the global torch._utils._rebuild_qtensor"));
  CHECK_THAT(check("\x80\x02"
                   "ctorch._tensor\n_rebuild_from_type_v2\n."),
             in_member("the global torch._tensor._rebuild_from_type_v2"));
  // LibTorch reads a dict's items in pairs without counting them.
  CHECK_THAT(check("\x80\x02}(K\x01u."), in_member("SETITEMS of an odd number"));
  CHECK_THAT(check("\x80\x02(K\x01K\x02K\x03"
                   "d."),
             in_member("a dict of an odd number"));
  // A call of a global index that was never pushed, a memo entry never stored, a stack or mark that runs out.
  CHECK_THAT(check("\x80\x02K\x05)R."), in_member("a call of no global"));
  CHECK_THAT(check("\x80\x02h\x03."), in_member("memo index 3 was never stored"));
  CHECK_THAT(check("\x80\x02t."), in_member("no mark"));
  CHECK_THAT(check("\x80\x02(0."), in_member("stack exhausted"));
  CHECK_THAT(check("\x80\x02X\xff\xff\xff\x7f"), in_member("truncated"));
}
