// Hostile files: every file accel reads survives a bounded, seeded mutation campaign (tests/support/mutate.hpp).
// For each format, ACCEL_FUZZ_CASES (default 10000; 3000 under AddressSanitizer) mutants of a valid file go straight to
// the format's reader, bypassing the manifest (which would reject nearly all of them before any parser ran): the
// manifest's text, the checkpoint description (accel_checkpoint.pt), a process's record bytes (step, RNG and loader
// states), a whole process_<r>.pt, a model's and an optimizer's archive, and accel-plan's golden JSON. Then a smaller
// set goes through Checkpointer::load (what Accelerator::load_state runs) with the manifest on.
//
// Each mutant must be read or rejected with one accel::FileError that names the file, carries no C++ backtrace,
// and must not allocate by an unchecked size: this process caps any single allocation at 1 GiB (operator new and
// LibTorch's CPU allocator count and refuse it: the test fails if any was asked for) and its address space
// (RLIMIT_AS) at what it has mapped plus 4 GiB. A crash or a hang fails the test too (ctest's timeout).
// ACCEL_FUZZ_SEED changes the campaign's seed; a failure prints its case number, which reproduces it.
#include "../support/mutate.hpp"
#include "../support/readers.hpp"

#include <accel/checkpoint/checkpointer.hpp>
#include <accel/checkpoint/safetensors.hpp>
#include <accel/config.hpp>
#include <accel/data/prepare.hpp>
#include <accel/optim/accelerated.hpp>
#include <accel/optim/schedulers.hpp>
#include <accel/optim/sharded.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <sys/resource.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/schedulers/step_lr.h>
#include <unistd.h>
#include <catch2/catch.hpp>

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
// array and aligned forms of the standard library call it or allocate by the same rule below. Under AddressSanitizer
// its own allocator keeps operator new (replacing it would pair ASan's allocations with our free): there the cap is
// ASAN_OPTIONS's max_allocation_size_mb, and an allocation over it fails the run.
#if !defined(__SANITIZE_ADDRESS__)
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
#endif

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
#if defined(__SANITIZE_ADDRESS__)
  constexpr std::size_t fallback = 3000;  // a few times slower under AddressSanitizer
#else
  constexpr std::size_t fallback = 10000;
#endif
  return v ? std::size_t(std::strtoull(v, nullptr, 10)) : fallback;
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
  for (int k = 0; k < mutate::kinds; ++k)
    std::cout << s.by_kind[k] << " " << mutate::kind_name(k) << (k + 1 < mutate::kinds ? ", " : "");
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
  mutate::Format f{std::move(name),          std::move(seed),       std::move(donor),    mutate::zip::regions,
                   mutate::zip::size_fields, mutate::zip::fix_crcs, mutate::zip::numbers};
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
  // A shuffled loader 5 batches into its third epoch (2 processes, 8 samples a step), and a sequential one unstarted.
  r.loaders.push_back({.epoch = 2,
                       .batches = 5,
                       .generator_state = r.rng_cpu,
                       .position = 40,
                       .processes = 2,
                       .drawn_by = 2,
                       .samples = 100,
                       .batch_size = 4});
  r.loaders.push_back({.position = 0, .processes = 2, .drawn_by = 2, .samples = 10, .batch_size = 1});
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
  for (const char* name :
       {"accel_checkpoint.pt", "model.pt", "model_1.pt", "optimizer.pt", "process_0.pt", "scheduler.pt"})
    m.files.push_back(
        {name, std::uint64_t(std::strlen(name)) * 1000 + 17, accel::checkpoint::crc32c(std::string_view(name))});
  const std::string text = m.text();
  const std::string path = "ckpt/manifest.txt";
  mutate::Format f{"manifest", Bytes(text.begin(), text.end()), {}, {}, {}, {}};
  campaign(f, path, [&](std::span<const std::uint8_t> b) { readers::manifest(b, path); });
}

TEST_CASE("hostile files: a process record (step, generator and loader states)", "[fuzz][record]") {
  const auto r = sample_record();
  Bytes blob;
  accel::serialize(r, blob);
  // The counts of the layout: step, rng_cpu, rng_device, loaders (each: epoch, batches, generator state, then six
  // integers and a one-byte flag: 73 bytes and the state).
  auto fields = [n = r.rng_cpu.size()](std::span<const std::uint8_t>) {
    std::vector<mutate::Field> out{{8, 8}, {16 + n, 8}, {24 + n, 8}};
    out.push_back({32 + n + 16, 8});
    out.push_back({32 + n + 73 + n + 16, 8});
    return out;
  };
  mutate::Format f{"process record", blob, {}, {}, fields, {}};
  const std::string path = "ckpt/process_0.pt";
  campaign(f, path, [&](std::span<const std::uint8_t> b) { readers::process_record(b, path); });
}

TEST_CASE("hostile files: the checkpoint description (accel_checkpoint.pt)", "[fuzz][meta]") {
  torch::serialize::OutputArchive meta;
  accel::checkpoint::write_meta(
      meta, {accel::checkpoint::format_version, 1, 1, 1, 1, 1, 1, 0, accel::tracking::Position{7, 42}});
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
  for (const char* file : {"batch_sampler_shard", "iterable_dataset_shard", "skip_first_batches",
                           "skip_first_batches_prepared", "dataloader_shard_e2e", "dataloader_dispatch_e2e"}) {
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
  accel::data::LoaderState loader{.epoch = 1,
                                  .batches = 3,
                                  .generator_state = accel::generator_bytes(at::detail::getDefaultCPUGenerator()),
                                  .position = 12,
                                  .processes = 1,
                                  .drawn_by = 1,
                                  .samples = 50,
                                  .batch_size = 4};
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
    std::ofstream(work / name, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    ++s.by_kind[kind];
    ++s.cases;
    try {
      ck.load(work, p);
      ++s.accepted;
      if (b != f.seed) s.failures.push_back("case " + std::to_string(i) + ": a changed " + name + " was loaded");
    } catch (...) {
      const auto wrong = judge((work / name).string());
      if (wrong.empty())
        ++s.rejected;
      else
        s.failures.push_back("case " + std::to_string(i) + " (" + mutate::kind_name(kind) + " of " + name +
                             "): " + wrong);
    }
  }
  s.failure_count = s.failures.size();
  std::cout << "load_state: " << s.cases << " damaged checkpoints, " << s.rejected
            << " rejected naming the damaged file, " << s.accepted << " unchanged and loaded\n";
  for (const auto& f : s.failures) UNSCOPED_INFO(f);
  CHECK(s.failure_count == 0);
  CHECK(s.rejected > n * 9 / 10);
  CHECK(refused.load() == 0);
  fs::remove_all(root);
}

namespace {

// Whether every element `t` addresses lies inside its storage (what LibTorch never compares).
bool inside_storage(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return true;
  std::int64_t last = t.storage_offset();
  for (std::int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return t.storage_offset() >= 0 && std::uint64_t(last + 1) * t.element_size() <= t.storage().nbytes();
}

// 50 samples, batches of 4, shuffled by a generator of its own, on one process.
auto shuffled_loader() {
  return accel::data::prepare_data_loader<accel::CheckedConfig<accel::dist::gloo>>(
      accel::data::DataLoader(accel::data::RangeDataset<std::vector<std::int64_t>>(std::vector<std::int64_t>(50)),
                              {.batch_size = 4, .shuffle = true, .seed = 9}),
      accel::data::PrepareContext{1, 0, nullptr});
}

// A job's registered objects, as the Accelerator registers them: a model, its Adam (AcceleratedOptimizer), an
// accel::StepLR and a LibTorch StepLR (AcceleratedScheduler), a shuffled prepared loader, a GradScaler and a custom
// object; `train` runs a step of all of it and an epoch of the loader.
struct Job {
  torch::nn::Sequential model = small_model();
  std::shared_ptr<torch::optim::Adam> adam =
      std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
  accel::AcceleratedOptimizer<torch::optim::Adam> opt{adam};
  accel::AcceleratedScheduler<accel::StepLR> exact{
      std::make_shared<accel::StepLR>(*adam, accel::StepLROptions{.step_size = 3, .gamma = 0.5}), {}, {}};
  accel::AcceleratedScheduler<torch::optim::StepLR> libtorch{
      std::make_shared<torch::optim::StepLR>(*adam, 2, 0.9), {}, {}};
  decltype(shuffled_loader()) loader = shuffled_loader();
  std::shared_ptr<accel::GradScaler> scaler = std::make_shared<accel::GradScaler>(c10::Device(c10::kCPU));
  std::vector<double> custom{1.0, 2.0, 3.0};
  accel::checkpoint::Checkpointer ck;

  Job() {
    ck.add_model(model.ptr());
    ck.add_optimizer({[o = opt](auto& a) { o.save(a); }, [o = opt](auto& a) mutable { o.load(a); },
                      [o = opt](auto& a) { o.check(a); }});
    ck.add_scheduler({[s = exact](auto& a) { s.save(a); }, [s = exact](auto& a) mutable { s.load(a); },
                      [s = exact](auto& a) { s.check(a); }});
    ck.add_scheduler({[s = libtorch](auto& a) { s.save(a); }, [s = libtorch](auto& a) mutable { s.load(a); },
                      [s = libtorch](auto& a) { s.check(a); }});
    ck.add_loader({[l = loader] { return l.state_dict(); },
                   [l = loader](const accel::data::LoaderState& s) mutable {
                     l.load_state_dict(s, accel::data::GlobalGenerator::restored_by_caller);
                   },
                   [l = loader](const accel::data::LoaderState& s) { return l.state_mismatch(s); },
                   [l = loader](const accel::data::LoaderState& s) { return l.state_unreachable(s); }});
    ck.set_scaler({[s = scaler](auto& a) { s->save(a); }, [s = scaler](auto& a) { s->load(a); },
                   [s = scaler](auto& a) { s->check(a); }});
    ck.add_custom(accel::checkpoint::Custom::of(custom));
  }
  // One training step and one epoch of the loader (its first batches, then the rest after a save).
  void train(std::int64_t batches) {
    torch::manual_seed(1);
    for (std::int64_t k = 0; k < batches; ++k) {
      adam->zero_grad();
      model->forward(torch::randn({4, 6})).pow(2).sum().backward();
      opt.step();
      exact.step();
      libtorch.step();
    }
  }
  // `batches` batches of the loader (all of its epoch: -1).
  void epoch(std::int64_t batches) {
    std::int64_t seen = 0;
    for (const auto& b : loader) {
      (void)b;
      if (++seen == batches) break;
    }
  }
  // What a loaded state holds that a job could not have: "" if nothing.
  std::string structural_problem() {
    for (const auto& t : model->parameters())
      if (!inside_storage(t)) return "a parameter outside its storage";
    for (const auto& t : model->buffers())
      if (!inside_storage(t)) return "a buffer outside its storage";
    if (auto what = accel::optimizer_state_problem(*adam); !what.empty()) return what;
    for (const auto& [key, state] : adam->state()) {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*state);
      if (!inside_storage(s.exp_avg()) || !inside_storage(s.exp_avg_sq()))
        return "an optimizer state outside its storage";
    }
    for (const double lr : exact->get_last_lr())
      if (!std::isfinite(lr)) return "a scheduler rate that is not finite";
    return "";
  }
};

// A ZeRO partition registered as the Accelerator registers it (accelerator/prepare.hpp).
accel::checkpoint::Checkpointer::Partition partition_of(const std::shared_ptr<accel::ShardedOptimizer>& sharded) {
  return {{[s = sharded](auto& a) { s->save(a); }, [s = sharded](auto& a) { s->load(a); },
           [s = sharded](auto& a) { s->check(a); }},
          [s = sharded](auto& parts) { s->check_resharded(parts); },
          [s = sharded](auto& parts) { s->load_resharded(parts); }};
}

// A model whose Adam is sharded (ZeRO stage 1, one process): the checkpoint holds its partition, zero_0_rank0.pt.
struct ZeroJob {
  torch::nn::Sequential model = small_model();
  std::shared_ptr<torch::optim::Adam> adam =
      std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
  std::shared_ptr<accel::ShardedOptimizer> sharded = std::make_shared<accel::ShardedOptimizer>(adam, nullptr, 1);
  accel::checkpoint::Checkpointer ck;

  ZeroJob() {
    sharded->build();
    ck.add_model(model.ptr());
    ck.add_partition(partition_of(sharded));
  }
  void train(std::int64_t batches) {
    torch::manual_seed(1);
    for (std::int64_t k = 0; k < batches; ++k) {
      adam->zero_grad();
      model->forward(torch::randn({4, 6})).pow(2).sum().backward();
      sharded->step();
    }
  }
  void epoch(std::int64_t) {}
  std::string structural_problem() {
    for (const auto& t : model->parameters())
      if (!inside_storage(t)) return "a parameter outside its storage";
    return accel::optimizer_state_problem(sharded->inner());
  }
};

// A fully sharded model (shard::parameters, one process: units "0" and "2", the BatchNorm in the root unit) and its
// Adam over its pieces: the checkpoint holds the model's shards and buffers, model_0_rank0.pt, and the optimizer's
// pieces, zero_0_rank0.pt. Trained as the prepared model's door drives the sharder.
struct FsdpJob {
  torch::nn::Sequential model = small_model();
  std::shared_ptr<torch::optim::Adam> adam =
      std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
  std::shared_ptr<accel::UnitSharder> sharder = shard(model);
  std::shared_ptr<accel::ShardedOptimizer> sharded = std::make_shared<accel::ShardedOptimizer>(adam, nullptr, 3);
  accel::checkpoint::Checkpointer ck;

  static std::shared_ptr<accel::UnitSharder> shard(torch::nn::Sequential& m) {
    std::vector<std::pair<std::string, at::Tensor>> trainable;
    for (const auto& p : m->named_parameters()) trainable.emplace_back(p.key(), p.value());
    auto s = std::make_shared<accel::UnitSharder>(*m, nullptr, accel::ShardingOptions{.units = {"0", "2"}}, trainable);
    s->watch();
    return s;
  }
  FsdpJob() {
    sharded->build_over([s = sharder](const at::Tensor& p) { return s->piece_of(p); });
    ck.add_model(model.ptr(), accel::checkpoint::sharded_model(sharder));
    ck.add_partition(partition_of(sharded));
  }
  void train(std::int64_t batches) {
    torch::manual_seed(1);
    for (std::int64_t k = 0; k < batches; ++k) {
      sharded->zero_grad();
      sharder->before_forward();
      const at::Tensor loss = model->forward(torch::randn({4, 6})).pow(2).sum();
      sharder->after_forward(true);
      loss.backward();
      sharder->end_of_backward(true);
      sharded->step();
    }
  }
  void epoch(std::int64_t) {}
  std::string structural_problem() {
    accel::GatheredParameters whole({sharder}, false);
    for (const auto& t : model->parameters())
      if (!inside_storage(t)) return "a parameter outside its storage";
    for (const auto& t : model->buffers())
      if (!inside_storage(t)) return "a buffer outside its storage";
    return accel::optimizer_state_problem(sharded->inner());
  }
};

}  // namespace

// The forged-checkpoint campaign over the checkpoint a `J` saves after its first steps (J: a job's registered
// objects, with `ck`, `train`, `epoch` and `structural_problem`): `files` files, each changed in turn and the
// manifest rewritten to match; each load is refused naming the changed file, or loads a state that trains, runs
// an epoch and saves again.
template <class J>
void forge(const char* label, std::size_t files) {
  arm();
  refused = 0;
  namespace fs = std::filesystem;
  const auto root = fs::temp_directory_path() / ("accel_forged_" + std::to_string(::getpid()) + "_" + label);
  const auto dir = root / "ckpt", work = root / "work", again = root / "again";
  const accel::checkpoint::Checkpointer::Process p{0, 1, c10::Device(c10::kCPU), [] {}};
  J saver;
  saver.train(5);
  saver.epoch(3);  // mid-epoch: a position, a generator state
  saver.ck.save(dir, p, 1, false);
  {
    J fresh;
    REQUIRE(fresh.ck.load(dir, p) == 1);
    REQUIRE(fresh.structural_problem().empty());
  }
  std::vector<mutate::Format> formats;  // every file the manifest lists
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (name == accel::checkpoint::manifest_file) continue;
    std::ifstream in(e.path(), std::ios::binary);
    Bytes b(std::istreambuf_iterator<char>(in), {});
    formats.push_back(name.ends_with(".pt") ? archive_format(name, b) : mutate::Format{name, b, {}, {}, {}, {}});
  }
  std::sort(formats.begin(), formats.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  REQUIRE(formats.size() == files);
  const std::size_t n = std::max<std::size_t>(cases() / 10, 80);
  std::size_t loaded = 0, rejected = 0, trained = 0;
  std::vector<std::string> failures;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    const auto& f = formats[i % formats.size()];
    fs::remove_all(work);
    fs::copy(dir, work);
    int kind = 0;
    bool confined = false;
    const auto b = mutate::mutant(f, seed(), i, kind, confined);
    std::ofstream(work / f.name, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    accel::checkpoint::Manifest::of_directory(work).write(work);  // forged: the manifest lists the changed file
    const std::string where = "case " + std::to_string(i) + " (" + mutate::kind_name(kind) + " of " + f.name + "): ";
    J job;
    try {
      job.ck.load(work, p);
    } catch (...) {
      // Refused: by the file it read (another file only when the description names what it holds).
      const auto wrong = judge((work / f.name).string());
      bool named = wrong.empty();
      if (!named) try {
          throw;
        } catch (const std::exception& e) {
          named = std::string(e.what()).find(f.name) != std::string::npos;  // an InvalidArgument naming the file
        }
      if (named)
        ++rejected;
      else
        failures.push_back(where + wrong);
      continue;
    }
    ++loaded;
    if (const auto what = job.structural_problem(); !what.empty()) {
      failures.push_back(where + "loaded " + what);
      continue;
    }
    try {
      job.train(2);
      job.epoch(-1);
      fs::remove_all(again);
      job.ck.save(again, p, 0, false);
      ++trained;
    } catch (const std::exception& e) {
      failures.push_back(where + "loaded, then failed to train or save: " + e.what());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "forged checkpoints (" << label << "): " << n << " cases over " << formats.size() << " files (seed "
            << seed() << "): " << rejected << " refused naming the file, " << loaded << " loaded (" << trained
            << " trained and saved again), in " << seconds << " s\n";
  for (std::size_t k = 0; k < std::min<std::size_t>(failures.size(), 10); ++k) UNSCOPED_INFO(failures[k]);
  CHECK(failures.empty());
  CHECK(rejected + loaded == n);
  CHECK(refused.load() == 0);
  fs::remove_all(root);
}

TEST_CASE(
    "forged checkpoints: a file changed and the manifest rewritten to match is refused naming the file, or is a "
    "structurally valid state that trains and saves",
    "[fuzz][forged]") {
  forge<Job>("job", 8);  // accel_checkpoint, custom_0, model, optimizer, process_0, scaler, scheduler, scheduler_1
}

TEST_CASE("forged checkpoints: a ZeRO partition of the optimizer state", "[fuzz][forged]") {
  forge<ZeroJob>("zero", 4);  // accel_checkpoint, model, process_0, zero_0_rank0
}

TEST_CASE("forged checkpoints: a fully sharded model's shards and its optimizer's pieces", "[fuzz][forged]") {
  forge<FsdpJob>("fsdp", 4);  // accel_checkpoint, model_0_rank0, process_0, zero_0_rank0
}

TEST_CASE("hostile files: a model's safetensors file (save_model's, through load_model), then a training step",
          "[fuzz][safetensors]") {
  arm();
  refused = 0;
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("accel_fuzz_safetensors_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto [model, opt] = trained();
  accel::checkpoint::save_model(*model, dir);
  const auto file = dir / accel::checkpoint::safe_weights_name;
  std::ifstream in(file, std::ios::binary);
  const Bytes seed_bytes(std::istreambuf_iterator<char>(in), {});
  // The header's length (8 bytes) is the size field; its JSON and the data follow.
  mutate::Format f{"model.safetensors",
                   seed_bytes,
                   {},
                   {},
                   [](std::span<const std::uint8_t>) {
                     return std::vector<mutate::Field>{{0, 8}};
                   },
                   {}};
  const auto path = (dir / "mutant.safetensors").string();
  campaign(f, path, [&](std::span<const std::uint8_t> b) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    auto target = small_model();
    try {
      accel::checkpoint::load_model(*target, path);
    } catch (const accel::checkpoint::SafetensorsError& e) {
      const std::string what = e.what();
      if (what.find(path) == std::string::npos)
        throw std::runtime_error("a SafetensorsError not naming the file: " + what);
      throw accel::FileError(path, what);  // the campaign's judge: one error, naming the file
    }
    for (const auto& t : target->parameters())
      if (!inside_storage(t)) throw std::runtime_error("loaded a parameter outside its storage");
    target->forward(torch::randn({4, 6})).sum().backward();  // a loaded model trains
  });
  fs::remove_all(dir);
}

TEST_CASE(
    "hostile files: a sharded safetensors directory (its index, then a shard) read whole by "
    "load_safetensors_sharded",
    "[fuzz][safetensors]") {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("accel_fuzz_safetensors_dir_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto [model, opt] = trained();
  const auto plan =
      accel::checkpoint::save_safetensors_sharded(accel::checkpoint::model_state(*model), dir, {.max_shard_size = 64});
  REQUIRE(plan.files.size() >= 3);
  auto bytes = [&](const std::string& name) {
    std::ifstream in(dir / name, std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(in), {});
  };
  const std::string index = accel::checkpoint::safe_weights_index_name, shard = plan.files[1].first;
  const auto index_bytes = bytes(index), shard_bytes = bytes(shard);
  // The index is JSON (no size fields); a shard's header length is its size field.
  mutate::Format i{"model.safetensors.index.json", index_bytes, {}, {}, {}, {}};
  campaign(i, (dir / index).string(),
           [&](std::span<const std::uint8_t> b) { readers::safetensors_dir(b, dir, index); });
  std::ofstream(dir / index, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(index_bytes.data()), std::streamsize(index_bytes.size()));
  mutate::Format s{
      shard, shard_bytes, {}, {}, [](std::span<const std::uint8_t>) {
                     return std::vector<mutate::Field>{{0, 8}}; }, {}};
  campaign(s, (dir / shard).string(),
           [&](std::span<const std::uint8_t> b) { readers::safetensors_dir(b, dir, shard); });
  fs::remove_all(dir);
}
