// Hostile files: every file accel reads survives a bounded, seeded mutation campaign (tests/support/mutate.hpp).
// For each format, ACCEL_FUZZ_CASES (default 10000) mutants of a valid file go straight to the format's reader,
// bypassing the manifest (which would reject nearly all of them before any parser ran): the manifest's text, the
// checkpoint description (accel_checkpoint.pt), a process's record bytes (step, RNG and loader states), a whole
// process_<r>.pt, a model's and an optimizer's archive, and accel-plan's golden JSON. Then a smaller set goes
// through Checkpointer::load (what Accelerator::load_state runs) with the manifest on.
//
// Each mutant must be read or rejected with one accel::FileError that names the file, carries no C++ backtrace,
// and must not allocate by an unchecked size: this process caps any single allocation at 1 GiB (operator new and
// LibTorch's CPU allocator count and refuse it: the test fails if any was asked for) and its address space
// (RLIMIT_AS) at what it has mapped plus 4 GiB. A crash or a hang fails the test too (ctest's timeout).
// ACCEL_FUZZ_SEED changes the campaign's seed; a failure prints its case number, which reproduces it.
#include "../support/mutate.hpp"
#include "../support/readers.hpp"

#include <accel/checkpoint/checkpointer.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>

namespace {

// ---- the allocation cap ----------------------------------------------------------------------------------
constexpr std::size_t alloc_cap = std::size_t(1) << 30;
std::atomic<std::size_t> refused{0}, largest_refused{0};
void refuse(std::size_t n) {
  ++refused;
  std::size_t seen = largest_refused.load();
  while (n > seen && !largest_refused.compare_exchange_weak(seen, n)) {
  }
}

}  // namespace

// Every operator new of the process (LibTorch's strings and vectors included) goes through this one; the nothrow,
// array and aligned forms of the standard library call it or allocate by the same rule below.
void* operator new(std::size_t n) {
  if (n > alloc_cap) {
    refuse(n);
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
// GCC sees the malloc behind the replaced new and the free behind the replaced delete, not that they pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

// LibTorch's tensors and zip records come from its CPU allocator, not operator new.
struct CappedCpuAllocator final : c10::Allocator {
  c10::Allocator* base = c10::GetDefaultCPUAllocator();
  c10::DataPtr allocate(std::size_t n) override {
    if (n > alloc_cap) {
      refuse(n);
      throw std::bad_alloc();
    }
    return base->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base->copy_data(dest, src, count); }
};

void arm() {
  static const bool armed = [] {
    static CappedCpuAllocator capped;
    c10::SetCPUAllocator(&capped, /*priority=*/255);
    std::ifstream statm("/proc/self/statm");
    std::size_t pages = 0;
    statm >> pages;
    const rlim_t limit = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE)) + (rlim_t(4) << 30);
    rlimit rl{limit, limit};
    ::setrlimit(RLIMIT_AS, &rl);
    return true;
  }();
  (void)armed;
}

using accel_test::mutate::Bytes;
namespace mutate = accel_test::mutate;

std::size_t cases() {
  const char* v = std::getenv("ACCEL_FUZZ_CASES");
  return v ? std::size_t(std::strtoull(v, nullptr, 10)) : 10000;
}
std::uint64_t seed() {
  const char* v = std::getenv("ACCEL_FUZZ_SEED");
  return v ? std::strtoull(v, nullptr, 10) : 20240612;
}

// The one error a reader may throw: accel::FileError naming `path`, its message starting with the path and free
// of LibTorch's C++ backtrace. Called inside a catch block.
std::string judge(const std::string& path) {
  try {
    throw;
  } catch (const accel::FileError& e) {
    const std::string what = e.what();
    if (e.path() != path) return "FileError names " + e.path() + ", not " + path;
    if (what.rfind(path + ": ", 0) != 0) return "message does not start with the file: " + what;
    if (what.find("Exception raised from") != std::string::npos || what.find("frame #") != std::string::npos)
      return "message carries a backtrace: " + what;
    return "";
  } catch (const std::exception& e) {
    return std::string("not an accel::FileError: ") + e.what();
  } catch (...) {
    return "not a std::exception";
  }
}

void report(const mutate::Stats& s, const std::string& name) {
  std::cout << name << ": " << s.cases << " cases (" << s.accepted << " read, " << s.rejected << " rejected; ";
  for (int k = 0; k < mutate::kinds; ++k) std::cout << s.by_kind[k] << " " << mutate::kind_name(k) << (k + 1 < mutate::kinds ? ", " : "");
  std::cout << "; " << s.confined << " inside a record with its CRC fixed) in " << s.seconds << " s, slowest case "
            << s.slowest * 1000 << " ms\n";
  for (const auto& f : s.failures) UNSCOPED_INFO(f);
  INFO("largest refused allocation: " << largest_refused.load() << " bytes");
  CHECK(s.failure_count == 0);
  CHECK(s.cases == cases());
  CHECK(refused.load() == 0);  // no allocation over 1 GiB was even asked for
  CHECK(s.slowest < 2.0);      // a valid file reads in milliseconds: a case taking seconds is a hang in the making
}

template <class Read>
void campaign(const mutate::Format& f, const std::string& path, Read&& read) {
  arm();
  refused = 0;
  read(std::span<const std::uint8_t>(f.seed));  // the seed itself reads
  const auto s = mutate::run(f, cases(), seed(), read, [&] { return judge(path); });
  report(s, f.name);
}

Bytes bytes_of(torch::serialize::OutputArchive& a) {
  Bytes b;
  a.save_to([&](const void* data, std::size_t n) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    b.insert(b.end(), p, p + n);
    return n;
  });
  return b;
}

mutate::Format archive_format(std::string name, Bytes seed, Bytes donor = {}) {
  mutate::Format f{std::move(name), std::move(seed), std::move(donor), mutate::zip::regions, mutate::zip::size_fields, mutate::zip::fix_crcs};
  return f;
}

torch::nn::Sequential small_model() {
  torch::manual_seed(3);
  return readers::small_model();
}
// A model and its Adam after one step (so the optimizer has state).
std::pair<torch::nn::Sequential, std::shared_ptr<torch::optim::Adam>> trained() {
  auto m = small_model();
  auto opt = std::make_shared<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2));
  m->forward(torch::randn({4, 6})).sum().backward();
  opt->step();
  return {m, opt};
}

std::size_t cpu_state_bytes() { return accel::generator_bytes(at::detail::getDefaultCPUGenerator()).size(); }

accel::checkpoint::ProcessRecord sample_record() {
  accel::checkpoint::ProcessRecord r{7, accel::generator_bytes(at::detail::getDefaultCPUGenerator()), {}, {}};
  r.loaders.push_back({2, 5, r.rng_cpu});
  r.loaders.push_back({0, 0, {}});
  return r;
}

Bytes process_archive(const accel::checkpoint::ProcessRecord& r) {
  std::vector<std::uint8_t> blob;
  accel::serialize(r, blob);
  torch::serialize::OutputArchive a;
  a.write("record", accel::detail::bytes_tensor(blob, c10::Device(c10::kCPU)));
  a.write("grad_0_0.weight", torch::randn({5, 6}));
  return bytes_of(a);
}

}  // namespace

TEST_CASE("hostile files: the checkpoint manifest", "[fuzz][manifest]") {
  accel::checkpoint::Manifest m;
  for (const char* name : {"accel_checkpoint.pt", "model.pt", "model_1.pt", "optimizer.pt", "process_0.pt", "scheduler.pt"})
    m.files.push_back({name, std::uint64_t(std::strlen(name)) * 1000 + 17, accel::checkpoint::crc32c(std::string_view(name))});
  const std::string text = m.text();
  const std::string path = "ckpt/manifest.txt";
  mutate::Format f{"manifest", Bytes(text.begin(), text.end()), {}, {}, {}, {}};
  campaign(f, path, [&](std::span<const std::uint8_t> b) { readers::manifest(b, path); });
}

TEST_CASE("hostile files: a process record (step, generator and loader states)", "[fuzz][record]") {
  const auto r = sample_record();
  Bytes blob;
  accel::serialize(r, blob);
  // The counts of the layout: step, rng_cpu, rng_device, loaders (each: epoch, batches, generator state).
  auto fields = [n = r.rng_cpu.size()](std::span<const std::uint8_t>) {
    std::vector<mutate::Field> out{{8, 8}, {16 + n, 8}, {24 + n, 8}};
    out.push_back({32 + n + 16, 8});
    out.push_back({32 + n + 24 + n + 16, 8});
    return out;
  };
  mutate::Format f{"process record", blob, {}, {}, fields, {}};
  const std::string path = "ckpt/process_0.pt";
  campaign(f, path, [&](std::span<const std::uint8_t> b) { readers::process_record(b, path); });
}

TEST_CASE("hostile files: the checkpoint description (accel_checkpoint.pt)", "[fuzz][meta]") {
  torch::serialize::OutputArchive meta;
  accel::checkpoint::write_meta(meta, {accel::checkpoint::format_version, 1, 1, 1, 1, 1, 1, 0, accel::tracking::Position{7, 42}});
  const std::string path = "ckpt/accel_checkpoint.pt";
  campaign(archive_format("accel_checkpoint.pt", bytes_of(meta)), path,
           [&](std::span<const std::uint8_t> b) { (void)accel::checkpoint::read_meta(b, path); });
}

TEST_CASE("hostile files: a process's archive (process_<r>.pt)", "[fuzz][process]") {
  const std::string path = "ckpt/process_0.pt";
  const auto state = cpu_state_bytes();
  auto donor = sample_record();
  donor.loaders.pop_back();
  campaign(archive_format("process_0.pt", process_archive(sample_record()), process_archive(donor)), path,
           [&](std::span<const std::uint8_t> b) {
             torch::serialize::InputArchive a;
             accel::checkpoint::load_archive(a, b, path);
             (void)accel::checkpoint::read_process_record(a, path, state);
             at::Tensor g;
             accel::checkpoint::reading(path, [&] { return a.try_read("grad_0_0.weight", g); });
           });
}

TEST_CASE("hostile files: a model's archive (model.pt)", "[fuzz][model]") {
  auto [model, opt] = trained();
  torch::serialize::OutputArchive a;
  model->save(a);
  torch::serialize::OutputArchive d;
  small_model()->save(d);
  const std::string path = "ckpt/model.pt";
  auto target = small_model();
  campaign(archive_format("model.pt", bytes_of(a), bytes_of(d)), path,
           [&](std::span<const std::uint8_t> b) { readers::model(b, path, *target); });
}

TEST_CASE("hostile files: an optimizer's archive (optimizer.pt)", "[fuzz][optimizer]") {
  auto [model, opt] = trained();
  torch::serialize::OutputArchive a;
  opt->save(a);
  const std::string path = "ckpt/optimizer.pt";
  auto target = small_model();
  torch::optim::Adam fresh(target->parameters(), torch::optim::AdamOptions(1e-2));
  campaign(archive_format("optimizer.pt", bytes_of(a)), path, [&](std::span<const std::uint8_t> b) {
    torch::serialize::InputArchive in;
    accel::checkpoint::load_archive(in, b, path);
    accel::checkpoint::reading(path, [&] { fresh.load(in); });
  });
}

TEST_CASE("hostile files: accel-plan's golden JSON", "[fuzz][golden]") {
  // The seed: the first two cases of each golden file of the six kinds.
  std::string seed = "{\"meta\": {\"description\": \"fuzz seed\"}, \"cases\": [\n";
  bool first = true;
  for (const char* file : {"batch_sampler_shard", "iterable_dataset_shard", "skip_first_batches", "skip_first_batches_prepared",
                           "dataloader_shard_e2e", "dataloader_dispatch_e2e"}) {
    std::ifstream in(std::string(ACCEL_TEST_DATA_DIR) + "/" + file + ".json");
    const auto ref = accel_plan::json::parse(in);
    for (std::size_t i = 0; i < 2; ++i) {
      seed += (first ? "" : ",\n") + ref.at("cases").at(i).dump();
      first = false;
    }
  }
  seed += "\n]}\n";
  const std::string path = "golden/seed.json";
  mutate::Format f{"golden JSON", Bytes(seed.begin(), seed.end()), {}, {}, {}, {}};
  std::size_t passed = 0;
  campaign(f, path, [&](std::span<const std::uint8_t> b) { passed += readers::golden(b, path); });
  CHECK(passed > 0);
}

TEST_CASE("hostile files: damaged checkpoints through Checkpointer::load, the manifest on", "[fuzz][load_state]") {
  arm();
  refused = 0;
  namespace fs = std::filesystem;
  const auto root = fs::temp_directory_path() / ("accel_fuzz_" + std::to_string(::getpid()));
  const auto dir = root / "ckpt";
  auto [model, opt] = trained();
  accel::data::LoaderState loader{1, 3, accel::generator_bytes(at::detail::getDefaultCPUGenerator())};
  accel::checkpoint::Checkpointer ck;
  ck.add_model(model.ptr());
  ck.add_optimizer({[o = opt](auto& a) { o->save(a); }, [o = opt](auto& a) { o->load(a); }});
  ck.add_loader({[&] { return loader; }, [&](const accel::data::LoaderState& s) { loader = s; }});
  const accel::checkpoint::Checkpointer::Process p{0, 1, c10::Device(c10::kCPU), [] {}};
  ck.save(dir, p, 4, true);
  REQUIRE(ck.load(dir, p) == 4);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names.size() == 5);  // accel_checkpoint.pt, manifest.txt, model.pt, optimizer.pt, process_0.pt
  const std::size_t n = std::max<std::size_t>(cases() / 20, 60);
  mutate::Stats s;
  const auto work = root / "work";
  std::vector<mutate::Format> formats;  // each file of the checkpoint, read once
  for (const auto& name : names) {
    std::ifstream in(dir / name, std::ios::binary);
    formats.push_back({name, Bytes(std::istreambuf_iterator<char>(in), {}), {}, {}, {}, {}});
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& f = formats[i % formats.size()];
    const auto& name = f.name;
    fs::remove_all(work);
    fs::copy(dir, work);
    int kind = 0;
    bool confined = false;
    const auto b = mutate::mutant(f, seed(), i, kind, confined);
    std::ofstream(work / name, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    ++s.by_kind[kind];
    ++s.cases;
    try {
      ck.load(work, p);
      ++s.accepted;
      if (b != f.seed) s.failures.push_back("case " + std::to_string(i) + ": a changed " + name + " was loaded");
    } catch (...) {
      const auto wrong = judge((work / name).string());
      if (wrong.empty()) ++s.rejected;
      else s.failures.push_back("case " + std::to_string(i) + " (" + mutate::kind_name(kind) + " of " + name + "): " + wrong);
    }
  }
  s.failure_count = s.failures.size();
  std::cout << "load_state: " << s.cases << " damaged checkpoints, " << s.rejected << " rejected naming the damaged file, "
            << s.accepted << " unchanged and loaded\n";
  for (const auto& f : s.failures) UNSCOPED_INFO(f);
  CHECK(s.failure_count == 0);
  CHECK(s.rejected > n * 9 / 10);
  CHECK(refused.load() == 0);
  fs::remove_all(root);
}
