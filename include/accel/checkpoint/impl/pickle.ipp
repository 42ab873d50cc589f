#pragma once
//! \file
//! The definition of `check_pickle` (checkpoint/pickle.hpp, included at its end), kept out of user code under
//! ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]) for its cost: 9 MB of g++'s 2,000 per
//! translation unit (benchmarks/README.md, "Separate compilation").

#include <accel/checkpoint/pickle.hpp>

namespace accel::checkpoint {

namespace detail {

// A value of LibTorch's unpickler, as far as check_pickle follows it.
struct PickleValue {
  enum Kind : std::uint8_t { opaque, integer, string, tuple, tensor } kind = opaque;
  std::int64_t integer_value = 0;
  std::shared_ptr<const std::string> string_value;
  std::shared_ptr<const std::vector<PickleValue>> items;  // a tuple's
  std::uint64_t storage_bytes = 0, item_size = 0;         // a tensor's storage and element size
};

// What a global that REDUCE or BUILD may call does to its argument (LibTorch's `globals_` table).
enum class PickleGlobal : std::uint8_t { rebuild_tensor, other };

inline bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}
inline bool add_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return __builtin_add_overflow(a, b, &out);
}

// The dtype of `torch.<name>`, as LibTorch's readGlobal resolves it ("FloatStorage": float).
inline std::optional<c10::ScalarType> storage_dtype(std::string_view name) {
#define ACCEL_STORAGE_NAME(_, n) \
  if (name == #n "Storage") return c10::k##n;
  AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(ACCEL_STORAGE_NAME)
#undef ACCEL_STORAGE_NAME
  return std::nullopt;
}

}  // namespace detail

ACCEL_DECL void check_pickle(std::span<const std::uint8_t> p, const std::string& path, std::string_view member,
                             const RecordSize& record_size) {
  using V = detail::PickleValue;
  auto fail = [&](const std::string& what) -> void {
    throw FileError(path, "not a readable LibTorch archive: " + std::string(member) + ": " + what);
  };
  // Where LibTorch reads this pickle's storages: "<archive>/data.pkl" reads "<archive>/data/<key>".
  const std::string_view stem = member.substr(0, member.rfind('.'));
  std::size_t i = 0;
  std::vector<V> stack, memo;
  std::vector<std::size_t> marks;
  std::vector<detail::PickleGlobal> globals;
  auto need = [&](std::uint64_t n) {
    if (n > p.size() - i) fail("truncated at byte " + std::to_string(i));
  };
  auto arg = [&](std::size_t n) {
    need(n);
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < n; ++k) v |= std::uint64_t(p[i + k]) << (8 * k);
    i += n;
    return v;
  };
  auto bytes = [&](std::uint64_t n) {
    need(n);
    std::string s(reinterpret_cast<const char*>(p.data() + i), std::size_t(n));
    i += std::size_t(n);
    return s;
  };
  auto line = [&] {
    const auto start = i;
    while (i < p.size() && p[i] != '\n') ++i;
    need(1);
    ++i;
    return std::string_view(reinterpret_cast<const char*>(p.data() + start), i - 1 - start);
  };
  auto integer = [](std::int64_t v) {
    V x;
    x.kind = V::integer;
    x.integer_value = v;
    return x;
  };
  auto text = [](std::string s) {
    V x;
    x.kind = V::string;
    x.string_value = std::make_shared<const std::string>(std::move(s));
    return x;
  };
  auto tuple_of = [](std::vector<V> items) {
    V x;
    x.kind = V::tuple;
    x.items = std::make_shared<const std::vector<V>>(std::move(items));
    return x;
  };
  auto pop = [&] {
    if (stack.empty() || (!marks.empty() && marks.back() == stack.size()))
      fail("stack exhausted at byte " + std::to_string(i));
    V v = std::move(stack.back());
    stack.pop_back();
    return v;
  };
  auto pop_mark = [&] {  // the values above the last mark, which it removes
    if (marks.empty()) fail("no mark at byte " + std::to_string(i));
    const auto start = marks.back();
    marks.pop_back();
    std::vector<V> items(std::make_move_iterator(stack.begin() + std::ptrdiff_t(start)),
                         std::make_move_iterator(stack.end()));
    stack.resize(start);
    return items;
  };
  auto put = [&](std::uint64_t id) {
    if (id > memo.size()) fail("memo index " + std::to_string(id) + " out of order");
    if (stack.empty()) fail("memo of an empty stack at byte " + std::to_string(i));
    if (id == memo.size())
      memo.push_back(stack.back());
    else
      memo[std::size_t(id)] = stack.back();
  };
  auto get = [&](std::uint64_t id) {
    if (id >= memo.size()) fail("memo index " + std::to_string(id) + " was never stored");
    stack.push_back(memo[std::size_t(id)]);
  };
  auto as_int = [](const V& v) -> std::optional<std::int64_t> {
    return v.kind == V::integer ? std::optional(v.integer_value) : std::nullopt;
  };
  // BINPERSID's tuple: a storage around its record.
  auto storage = [&](const V& t) {
    if (t.kind != V::tuple || t.items->size() < 5)
      fail("a persistent id that is not ('storage', dtype, key, device, numel)");
    const auto& e = *t.items;
    if (e[0].kind != V::string || *e[0].string_value != "storage" || e[2].kind != V::string || e[3].kind != V::string)
      fail("a persistent id that is not ('storage', dtype, key, device, numel)");
    const std::string& key = *e[2].string_value;
    const auto dtype = as_int(e[1]);
    if (!dtype || *dtype < 0 || *dtype >= std::int64_t(c10::ScalarType::NumOptions) ||
        c10::ScalarType(*dtype) == c10::ScalarType::Undefined)
      fail("storage '" + key + "' of an unknown dtype");
    const auto numel = as_int(e[4]);
    std::uint64_t item = 0;
    try {
      item = c10::elementSize(c10::ScalarType(*dtype));
    } catch (const std::exception&) {
    }
    if (item == 0) fail("storage '" + key + "' of dtype " + std::to_string(*dtype) + ", which has no element size");
    std::uint64_t declared = 0;
    if (!numel || *numel < 0 || detail::mul_overflows(std::uint64_t(*numel), item, declared))
      fail("storage '" + key + "' of " + (numel ? std::to_string(*numel) : std::string("no")) + " elements");
    if (declared > 0) {
      const std::string record = std::string(stem) + "/" + key;
      const auto held = record_size(record);
      if (!held) fail("storage '" + key + "' of " + std::to_string(declared) + " bytes has no record " + record);
      if (*held != declared)
        fail("storage '" + key + "' declares " + std::to_string(*numel) + " elements of " + std::to_string(item) +
             " bytes (" + std::to_string(declared) + " bytes), its record " + record + " holds " +
             std::to_string(*held) + " bytes");
    }
    V x;
    x.kind = V::tensor;
    x.storage_bytes = declared;
    x.item_size = item;
    return x;
  };
  // `_rebuild_tensor_v2(storage, offset, sizes, strides, ...)`: a view that must lie inside the storage.
  auto rebuild_tensor = [&](const V& t) {
    const auto* e = t.kind == V::tuple ? t.items.get() : nullptr;
    if (!e || e->size() < 4 || (*e)[0].kind != V::tensor || (*e)[2].kind != V::tuple || (*e)[3].kind != V::tuple ||
        !as_int((*e)[1]))
      fail("a tensor that is not (storage, offset, sizes, strides, ...)");
    const V& base = (*e)[0];
    const auto& sizes = *(*e)[2].items;
    const auto& strides = *(*e)[3].items;
    const std::int64_t offset = *as_int((*e)[1]);
    if (sizes.size() != strides.size())
      fail("a tensor of " + std::to_string(sizes.size()) + " sizes and " + std::to_string(strides.size()) + " strides");
    if (offset < 0) fail("a tensor at offset " + std::to_string(offset));
    std::uint64_t last = std::uint64_t(offset);  // the last element's index in the storage
    bool empty = false, overflow = false;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      const auto size = as_int(sizes[d]), stride = as_int(strides[d]);
      if (!size || !stride || *size < 0 || *stride < 0)
        fail("a tensor of a size or stride that is not a non-negative integer");
      if (*size == 0) empty = true;
      std::uint64_t reach = 0;
      if (*size > 0)
        overflow |= detail::mul_overflows(std::uint64_t(*size - 1), std::uint64_t(*stride), reach) ||
                    detail::add_overflows(last, reach, last);
    }
    std::uint64_t end = 0;  // one past the last byte
    if (!empty && (overflow || detail::add_overflows(last, 1, end) || detail::mul_overflows(end, base.item_size, end) ||
                   end > base.storage_bytes))
      fail("a tensor whose offset, sizes and strides reach past its storage of " + std::to_string(base.storage_bytes) +
           " bytes");
    return base;  // the view keeps the storage and its dtype
  };
  auto global = [&](std::string_view module, std::string_view name) {
    const std::string qualified = std::string(module) + "." + std::string(name);
    if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      globals.push_back(detail::PickleGlobal::rebuild_tensor);
    } else if (module == "torch") {
      if (const auto dtype = detail::storage_dtype(name)) return stack.push_back(integer(std::int64_t(*dtype)));
      if (name != "device") fail("the global " + qualified + ", which accel does not read");
      globals.push_back(detail::PickleGlobal::other);
    } else if ((module == "collections" && name == "OrderedDict") || (module == "builtins" && name == "complex") ||
               (module == "torch.jit._pickle" && name != "build_tensor_from_id") || module == "__torch__" ||
               module.starts_with("__torch__.")) {
      globals.push_back(detail::PickleGlobal::other);
    } else {  // quantized, sparse or subclassed tensors, tensor tables, RPC references, Python classes
      fail("the global " + qualified + ", which accel does not read");
    }
    stack.push_back(integer(std::int64_t(globals.size() - 1)));
  };

  while (true) {
    need(1);
    const std::uint8_t op = p[i++];
    switch (op) {
      case '.':  // STOP
        return;
      case 0x80:
        arg(1);
        break;  // PROTO
      case 0x95:
        arg(8);
        break;  // FRAME
      case '(':
        marks.push_back(stack.size());
        break;  // MARK
      case '0':
        pop();
        break;  // POP
      case '1':
        pop_mark();
        break;  // POP_MARK
      case '2': {
        V v = pop();
        stack.push_back(v);
        stack.push_back(std::move(v));
        break;
      }  // DUP
      case 'N':
      case 0x88:
      case 0x89:
      case ']':
      case '}':
      case 0x8f:
      case 'G':  // NONE, booleans, empty list/dict/set, float
        if (op == 'G') arg(8);
        stack.emplace_back();
        break;
      case ')':
        stack.push_back(tuple_of({}));
        break;  // EMPTY_TUPLE
      case 'K':
        stack.push_back(integer(std::int64_t(arg(1))));
        break;  // BININT1
      case 'M':
        stack.push_back(integer(std::int64_t(arg(2))));
        break;  // BININT2
      case 'J':
        stack.push_back(integer(std::int64_t(std::int32_t(arg(4)))));
        break;      // BININT
      case 0x8a: {  // LONG1
        const auto n = arg(1);
        if (n == 8) {
          stack.push_back(integer(std::int64_t(arg(8))));
        } else {
          need(n);
          i += std::size_t(n);
          stack.emplace_back();
        }
        break;
      }
      case 'X':
        stack.push_back(text(bytes(arg(4))));
        break;  // BINUNICODE
      case 0x8c:
        stack.push_back(text(bytes(arg(1))));
        break;  // SHORT_BINUNICODE
      case 0x8d:
        stack.push_back(text(bytes(arg(8))));
        break;  // BINUNICODE8
      case 'C':
      case 'U': {
        const auto n = arg(1);
        need(n);
        i += n;
        stack.emplace_back();
        break;
      }  // short bytes
      case 0x8b:
      case 'B':
      case 'T': {
        const auto n = arg(4);
        need(n);
        i += n;
        stack.emplace_back();
        break;
      }
      case 0x8e:
      case 0x96: {
        const auto n = arg(8);
        need(n);
        i += std::size_t(n);
        stack.emplace_back();
        break;
      }
      case 'I':
      case 'L':
      case 'S':
      case 'V':
      case 'F':
        line();
        stack.emplace_back();
        break;  // text literals
      case 'P':
        line();
        stack.emplace_back();
        break;  // PERSID (text): not LibTorch's
      case 't':
        stack.push_back(tuple_of(pop_mark()));
        break;  // TUPLE
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<V> items(std::size_t(op - 0x84));
        for (auto k = items.size(); k-- > 0;) items[k] = pop();
        stack.push_back(tuple_of(std::move(items)));
        break;
      }
      case 'l':
      case 'd':
      case 0x91: {  // LIST, DICT, FROZENSET
        // LibTorch reads a dict's keys and values in pairs, without comparing their count with the stack's
        if (pop_mark().size() % 2 != 0 && op == 'd') fail("a dict of an odd number of keys and values");
        stack.emplace_back();
        break;
      }
      case 'e':
      case 'u':
      case 0x90: {  // APPENDS, SETITEMS, ADDITEMS
        if (pop_mark().size() % 2 != 0 && op == 'u') fail("SETITEMS of an odd number of keys and values");
        if (stack.empty()) fail("no container below a mark");
        break;
      }
      case 'a':
        pop();
        if (stack.empty()) fail("APPEND without a list");
        break;  // APPEND
      case 's':
        pop();
        pop();
        if (stack.empty()) fail("SETITEM without a dict");
        break;  // SETITEM
      case 'q':
        put(arg(1));
        break;  // BINPUT
      case 'r':
        put(arg(4));
        break;  // LONG_BINPUT
      case 0x94:
        put(memo.size());
        break;  // MEMOIZE
      case 'h':
        get(arg(1));
        break;  // BINGET
      case 'j':
        get(arg(4));
        break;  // LONG_BINGET
      case 'p':
      case 'g': {  // PUT, GET: a decimal index and a newline
        std::uint64_t id = 0;
        const auto digits = line();
        if (digits.empty()) fail("bad memo index");
        for (const char c : digits) {
          if (c < '0' || c > '9' || id > memo.size()) fail("bad memo index");
          id = id * 10 + std::uint64_t(c - '0');
        }
        op == 'p' ? put(id) : get(id);
        break;
      }
      case 'c': {  // GLOBAL module\nname\n
        const auto module = line();
        global(module, line());
        break;
      }
      case 0x93:
        pop();
        pop();
        stack.emplace_back();
        break;  // STACK_GLOBAL: not LibTorch's
      case 0x81:
        pop();
        break;  // NEWOBJ: LibTorch drops the arguments' tuple
      case 0x92:
        pop();
        pop();
        pop();
        stack.emplace_back();
        break;  // NEWOBJ_EX: not LibTorch's
      case 'Q':
        stack.push_back(storage(pop()));
        break;  // BINPERSID
      case 'R':
      case 'b': {  // REDUCE, BUILD: LibTorch calls global <index below the argument> on the argument
        V argument = pop();
        const auto index = as_int(pop());
        if (!index || *index < 0 || std::uint64_t(*index) >= globals.size())
          fail("a call of no global at byte " + std::to_string(i - 1));
        if (globals[std::size_t(*index)] == detail::PickleGlobal::rebuild_tensor)
          stack.push_back(rebuild_tensor(argument));
        else
          stack.emplace_back();
        break;
      }
      default:
        fail("unknown pickle opcode " + std::to_string(op) + " at byte " + std::to_string(i - 1));
    }
  }
}

}  // namespace accel::checkpoint
