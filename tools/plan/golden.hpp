#pragma once
// accel-plan --golden: recompute every case of a golden file (the schema of the vectors produced by Python
// Accelerate) from its parameters alone, with the library's plans, and emit or check the results.

#include <accel/error.hpp>
#include <accel/plan/plan.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace accel_plan {

using nlohmann::json;
namespace plan = accel::plan;

//! The six kinds of golden file; recognised from the fields of each case.
enum class Kind { batch_sampler_shard, iterable_dataset_shard, skip_plain, skip_prepared, e2e_shard, e2e_dispatch };

inline Kind kind_of(const json& c) {
  if (c.contains("base_len")) return Kind::batch_sampler_shard;
  if (c.contains("skip_batch_sampler")) return Kind::skip_plain;
  if (c.contains("num_batches")) return Kind::skip_prepared;
  if (c.contains("dispatch_batches"))
    return c.at("dispatch_batches").get<bool>() ? Kind::e2e_dispatch : Kind::e2e_shard;
  if (c.contains("num_processes") && !c.contains("even_batches")) return Kind::iterable_dataset_shard;
  throw std::runtime_error("accel-plan: a case matches none of the six golden kinds: " + c.dump().substr(0, 200));
}

inline json batches_of(const plan::BatchPlan& p) {
  json out = json::array();
  for (std::int64_t j = 0; j < p.size(); ++j) {
    const auto s = p.span(j);
    json b = json::array();
    for (auto pos = s.begin; pos < s.end; ++pos) b.push_back(p.sample(pos));
    out.push_back(std::move(b));
  }
  return out;
}

inline json samples_of(const plan::BatchPlan& p) {
  json out = json::array();
  for (auto& b : batches_of(p))
    for (auto& x : b) out.push_back(x);
  return out;
}

inline json end_flags_of(const plan::BatchPlan& p) {
  json out = json::array();
  for (std::int64_t j = 0; j < p.size(); ++j) out.push_back(p.end_of_dataloader(j));
  return out;
}

inline plan::ShardSpec spec_of(const json& c, int rank) {
  return {.batch_size = c.at("batch_size").get<std::int64_t>(),
          .drop_last = c.value("drop_last", false),
          .num_processes = c.value("num_processes", 1),
          .process_index = rank,
          .split_batches = c.value("split_batches", false),
          .even_batches = c.value("even_batches", true)};
}

//! Runs `make(rank)` for every rank and collects `{process_index, ...fields}`; a library error for the
//! configuration becomes `error_field: message`, as in the reference files.
inline void per_process(json& out, const json& c, const std::string& error_field,
                        const std::function<json(int)>& make) {
  const int nproc = c.value("num_processes", 1);
  try {
    json processes = json::array();
    for (int r = 0; r < nproc; ++r) {
      json p = make(r);
      p["process_index"] = r;
      processes.push_back(std::move(p));
    }
    out["processes"] = std::move(processes);
  } catch (const accel::InvalidArgument& e) {
    out[error_field] = std::string("accel::InvalidArgument: ") + e.what();
  }
}

//! The case recomputed by the library: the input's parameters, plus results in the input's schema.
inline json emit_case(const json& in) {
  static const char* params[] = {
      "n",          "batch_size", "drop_last", "num_processes", "split_batches", "even_batches", "dispatch_batches",
      "num_batches"};
  json out = json::object();
  for (const char* k : params)
    if (in.contains(k)) out[k] = in.at(k);
  const std::int64_t n = in.at("n").get<std::int64_t>();
  switch (kind_of(in)) {
    case Kind::batch_sampler_shard:
      out["base_len"] = plan::batch_plan(in.at("batch_size"), in.value("drop_last", false), n).size();
      per_process(out, in, "constructor_error", [&](int r) {
        const auto p = plan::shard_plan(spec_of(in, r), n);
        return json{{"len", p.size()}, {"batches", batches_of(p)}};
      });
      break;
    case Kind::iterable_dataset_shard:
      per_process(out, in, "constructor_error", [&](int r) {
        const auto p = plan::iterable_plan(spec_of(in, r), n);
        const json samples = samples_of(p);
        return json{{"len", samples.size()}, {"samples", samples}};
      });
      break;
    case Kind::skip_plain: {
      const auto k = in.at("num_batches").get<std::int64_t>();
      const auto base = plan::batch_plan(in.at("batch_size"), in.value("drop_last", false), n);
      const auto p = base.skip(k);
      const json r{{"batches", batches_of(p)}, {"len", p.size()}};
      out["skip_first_batches"] = r;
      out["skip_first_batches"]["type"] = "BatchPlan";
      out["skip_batch_sampler"] = r;
      out["skip_batch_sampler"]["total_length"] = base.size();
      out["skip_data_loader"] = r;
      break;
    }
    case Kind::skip_prepared:
      per_process(out, in, "prepare_error", [&](int r) {
        const auto p = plan::loader_plan(spec_of(in, r), n, plan::Loading::sharded).skip(in.at("num_batches"));
        return json{{"type", "ShardedLoader"}, {"batches", batches_of(p)}, {"len", p.size()}};
      });
      break;
    case Kind::e2e_shard:
    case Kind::e2e_dispatch: {
      const bool dispatch = kind_of(in) == Kind::e2e_dispatch;
      per_process(out, in, "prepare_error", [&](int r) {
        const auto s = spec_of(in, r);
        const auto p = plan::loader_plan(s, n, dispatch ? plan::Loading::dispatched : plan::Loading::sharded);
        return json{{"type", dispatch ? "DispatchedLoader" : "ShardedLoader"},
                    {"len", p.size()},
                    {"total_batch_size", s.split_batches ? s.batch_size : s.batch_size * s.num_processes},
                    {"batches", batches_of(p)},
                    {"gs_end_of_dataloader", end_flags_of(p)}};
      });
      break;
    }
  }
  return out;
}

//! Compares one emitted case with the reference. Batches (or samples) and end_of_dataloader flags must be
//! identical; an error must meet an error. `len` must equal the reference's where the reference's `len`
//! is the number of batches it really yielded; where Accelerate's `len` is wrong (split mode Q4/Q5, or a
//! skip past the end, where it raises), ours must be the yielded count instead (README: differences).
inline bool check_case(const json& ref, const json& ours, std::string& why) {
  auto fail = [&](std::string m) {
    why = std::move(m);
    return false;
  };
  for (const char* err : {"constructor_error", "prepare_error"}) {
    if (ref.contains(err) != ours.contains(err))
      return fail(std::string(err) + ": reference " + (ref.contains(err) ? ref[err].dump() : "none") + ", accel " +
                  (ours.contains(err) ? ours[err].dump() : "none"));
    if (ref.contains(err)) return true;
  }
  auto same_len = [&](const json& r, const json& o, const char* items, const std::string& where) {
    const auto yielded = o.at(items).size();
    if (o.at("len").get<std::size_t>() != yielded) return fail(where + ": accel's len differs from what it yields");
    if (r.contains("len_error") || r.at(items).size() != r.value("len", std::size_t{0}))
      return true;  // Accelerate's len is off
    if (r.at("len") != o.at("len"))
      return fail(where + ": len " + o.at("len").dump() + ", reference " + r.at("len").dump());
    return true;
  };
  if (ref.contains("skip_batch_sampler")) {
    for (const char* v : {"skip_first_batches", "skip_batch_sampler", "skip_data_loader"}) {
      if (ref.at(v).at("batches") != ours.at(v).at("batches")) return fail(std::string(v) + ": batches differ");
      if (!same_len(ref.at(v), ours.at(v), "batches", v)) return false;
    }
    return true;
  }
  const auto& rp = ref.at("processes");
  const auto& op = ours.at("processes");
  if (rp.size() != op.size()) return fail("number of processes differs");
  const char* items = ref.at("processes").empty() || rp[0].contains("batches") ? "batches" : "samples";
  for (std::size_t i = 0; i < rp.size(); ++i) {
    const std::string where = "process " + std::to_string(i);
    if (rp[i].at(items) != op[i].at(items))
      return fail(where + ": " + items + " " + op[i].at(items).dump() + ", reference " + rp[i].at(items).dump());
    if (rp[i].contains("gs_end_of_dataloader") && rp[i]["gs_end_of_dataloader"] != op[i].at("gs_end_of_dataloader"))
      return fail(where + ": end_of_dataloader flags differ");
    if (!same_len(rp[i], op[i], items, where)) return false;
  }
  return true;
}

//! Reads a golden file's text (`path` names it in errors): JSON of at most 16 levels of nesting whose numbers are
//! all integers, with a "cases" array of objects whose parameters are integers within bounds far above any
//! reference file's (n, batch_size, num_batches up to 10000, up to 64 processes), so that a damaged or hostile
//! file is one `accel::FileError` instead of a parser's exception, a float cast out of range, or hours of plans.
inline json read_golden(std::string_view text, const std::string& path) {
  // Nesting bounded while parsing (the parser keeps its own stack; dumping or walking a deep value recurses).
  // The callback's depth counts the containers around the one starting: 0 for the outermost.
  const json::parser_callback_t bounded_depth = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth >= 16)
      throw accel::FileError(path, "JSON nested deeper than 16 levels");
    return true;
  };
  json ref;
  try {
    ref = json::parse(text, bounded_depth);
  } catch (const json::exception& e) {
    throw accel::FileError(path, std::string("not valid JSON: ") + e.what());
  }
  const std::function<void(const json&)> integers_only = [&](const json& v) {
    if (v.is_number_float())
      throw accel::FileError(path, "a non-integer number " + v.dump() + " (golden files hold integers)");
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > (std::uint64_t(1) << 53))
      throw accel::FileError(path, "the number " + v.dump() + " is out of range");
    if (v.is_structured())
      for (const auto& e : v) integers_only(e);
  };
  integers_only(ref);
  if (!ref.is_object() || !ref.contains("cases") || !ref.at("cases").is_array())
    throw accel::FileError(path, "no \"cases\" array: not a golden file");
  const auto& cases = ref.at("cases");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    auto bad = [&](const std::string& what) {
      throw accel::FileError(path, "case " + std::to_string(i) + ": " + what);
    };
    if (!c.is_object()) bad("not an object");
    auto bounded = [&](const char* key, std::int64_t lo, std::int64_t hi, bool required) {
      if (!c.contains(key)) {
        if (required) bad(std::string("no \"") + key + "\"");
        return;
      }
      const auto& v = c.at(key);
      if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
        bad(std::string("\"") + key + "\" is " + v.dump().substr(0, 40) + ", not an integer in [" + std::to_string(lo) +
            ", " + std::to_string(hi) + "]");
    };
    bounded("n", 0, 10000, true);
    bounded("batch_size", -10000, 10000, true);
    bounded("num_processes", 1, 64, false);
    bounded("num_batches", -10000, 10000, false);
    for (const char* flag : {"drop_last", "split_batches", "even_batches", "dispatch_batches"})
      if (c.contains(flag) && !c.at(flag).is_boolean()) bad(std::string("\"") + flag + "\" is not true or false");
  }
  return ref;
}

//! Runs `f` on case `i` of the golden file `path`, turning a schema mismatch (nlohmann's exceptions) or a library
//! error outside the reference's error fields into one `FileError` naming the file and the case.
template <class F>
decltype(auto) on_case(std::size_t i, const std::string& path, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const json::exception& e) {
    throw accel::FileError(path, "case " + std::to_string(i) + " does not fit the golden schema: " + e.what());
  } catch (const accel::FileError&) {
    throw;
  } catch (const std::exception& e) {  // accel::InvalidArgument outside the error fields, kind_of's runtime_error
    throw accel::FileError(path, "case " + std::to_string(i) + ": " + e.what());
  }
}

struct GoldenResult {
  std::size_t passed = 0, failed = 0;
  std::vector<std::string> failures;
};
//! Recomputes and checks every case of a golden file read by `read_golden`: the number that pass and the
//! first failures (up to `report`, with their reasons). A case whose fields do not fit the schema, or whose
//! parameters the library rejects outside the reference's error fields, is a `FileError` naming the file.
inline GoldenResult check_golden(const json& ref, const std::string& path, std::size_t report = 10) {
  GoldenResult out;
  const auto& cases = ref.at("cases");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    std::string why;
    if (on_case(i, path, [&] { return check_case(c, emit_case(c), why); })) {
      ++out.passed;
    } else if (++out.failed <= report) {
      json params = c;
      for (const char* k : {"processes", "skip_first_batches", "skip_batch_sampler", "skip_data_loader"})
        params.erase(k);
      out.failures.push_back(params.dump() + ": " + why);
    }
  }
  return out;
}

}  // namespace accel_plan
