// The persistent compile cache: cross-process hits, every kind of bad file, read-only mode,
// eviction, and many processes sharing one directory.
//
// Multi-process tests run this very binary again as a child (through /proc/<pid>/exe) with
// --gtest_filter=PersistentCacheChild.RunsTheWorkload and LAZYRT_PCACHE_CHILD=1. The child
// configures the cache from the environment as a user's program would, runs a fixed workload
// and prints its results and counters; the parent checks them against values computed here
// by plain arithmetic.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cache/persistent_cache.h"
#include "backend/cpu/jit/jit.h"
#include "trace/lazy_tensor.h"

namespace lazyrt::cache {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// ---- a temporary cache directory ---------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "lazyrt-pcache-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Names of the files in a directory, sorted.
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t entry_bytes_in(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".lzc") total += e.file_size();
  return total;
}

void set_mtime(const std::string& path, int64_t seconds_ago) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  struct timespec times[2] = {now, now};
  times[1].tv_sec -= seconds_ago;
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

int64_t mtime_ns(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

// ---- the workload children and tests run, and its values by plain arithmetic -------------

using Results = std::map<std::string, std::vector<double>>;

std::vector<double> values_of(const Tensor& t) {
  switch (t.dtype()) {
    case DType::f32: { auto v = t.to_vector<float>(); return {v.begin(), v.end()}; }
    case DType::f64: return t.to_vector<double>();
    case DType::i64: { auto v = t.to_vector<int64_t>(); return {v.begin(), v.end()}; }
    default: throw std::runtime_error("unexpected dtype in the workload");
  }
}

const std::vector<float> kX = {1, -2, 0.5, 3, 0, -1, 2, 2, 1, -0.5, 1.5, 4};  // [4, 3]
const std::vector<float> kW1 = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f,
                                0.9f, 1.0f, -1.1f, 1.2f, 0.3f, -0.4f, 0.5f};  // [3, 5]
const std::vector<float> kB1 = {0.5f, -0.5f, 0.25f, 0, 1};                   // [5]
const std::vector<float> kW2 = {1, -1, 0.5f, 2, -0.5f, 1, 0.25f, 0.75f, 2, -2};  // [5, 2]

// Four distinct graphs: an MLP forward pass with its loss; three SGD steps that update a
// weight in place (one graph, with a donated buffer); a fori_loop; integer and boolean ops.
Results run_workload() {
  Results out;
  {
    Tensor x = tensor(kX, {4, 3}), w1 = tensor(kW1, {3, 5}), b1 = tensor(kB1, {5});
    Tensor w2 = tensor(kW2, {5, 2});
    Tensor y = matmul(relu(matmul(x, w1) + b1), w2);
    Tensor loss = (y * y).mean();
    sync({y, loss});
    out["mlp_y"] = values_of(y);
    out["mlp_loss"] = values_of(loss);
  }
  {
    Tensor w = tensor({1, 2, 3}, {3});
    for (int step = 0; step < 3; ++step) {
      Tensor grad = w * 2.0;  // d/dw of sum(w * w)
      w.add_(grad, -0.1);
      mark_step();
    }
    out["sgd_w"] = values_of(w);
  }
  {
    Carry c = fori_loop(0, 10, [](const Tensor& i, const Carry& c) {
      return Carry{c[0] * 2.0 + cast(i, DType::f64)};
    }, {scalar_tensor(1.0, DType::f64)});
    out["loop"] = values_of(c[0]);
  }
  {
    Tensor a = arange(5) * 3 - 1;
    Tensor above = cast(a > 4, DType::i64).sum();
    sync({a, above});
    out["ints"] = values_of(a);
    out["ints_above_4"] = values_of(above);
  }
  return out;
}
constexpr int kWorkloadGraphs = 4;

Results expected_workload() {
  Results e;
  std::vector<double> y(8, 0.0);
  for (int r = 0; r < 4; ++r) {
    double h[5];
    for (int j = 0; j < 5; ++j) {
      double z = kB1[j];
      for (int k = 0; k < 3; ++k) z += double{kX[r * 3 + k]} * kW1[k * 5 + j];
      h[j] = z > 0 ? z : 0;
    }
    for (int o = 0; o < 2; ++o)
      for (int j = 0; j < 5; ++j) y[r * 2 + o] += h[j] * kW2[j * 2 + o];
  }
  double loss = 0;
  for (double v : y) loss += v * v / 8;
  e["mlp_y"] = y;
  e["mlp_loss"] = {loss};
  const double decay = 0.8 * 0.8 * 0.8;  // w <- w - 0.1 * 2w, three times
  e["sgd_w"] = {decay, 2 * decay, 3 * decay};
  double v = 1;
  for (int i = 0; i < 10; ++i) v = 2 * v + i;
  e["loop"] = {v};
  e["ints"] = {-1, 2, 5, 8, 11};
  e["ints_above_4"] = {3};
  return e;
}

void expect_matches_expected(const Results& got, const std::string& who) {
  const Results want = expected_workload();
  ASSERT_EQ(got.size(), want.size()) << who;
  for (const auto& [name, values] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << who << ": no result " << name;
    ASSERT_EQ(it->second.size(), values.size()) << who << ": " << name;
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_NEAR(it->second[i], values[i], 1e-5 * (1 + std::abs(values[i])))
          << who << ": " << name << "[" << i << "]";
  }
}

// ---- child processes ---------------------------------------------------------------------

struct ChildOutput {
  std::vector<Results> results;  // one per repetition
  std::map<std::string, int64_t> counters;
  std::string config;
  std::string raw;  // everything it printed, for failure messages
  int status = -1;
};

constexpr const char* kCounters[] = {"UncachedCompile", "CachedCompile", "PersistentCacheHit",
                                     "PersistentCacheMiss", "PersistentCacheDeserializeFailure"};

// Runs in the child: prints the configuration it found, then the workload's results once per
// repetition, then the counters.
TEST(PersistentCacheChild, RunsTheWorkload) {
  const char* child = std::getenv("LAZYRT_PCACHE_CHILD");
  if (!child) return;  // only meaningful as a child of the tests below
  metrics::reset();
  std::printf("CONFIG dir=%s readonly=%d max=%llu\n", persistent_dir().c_str(),
              persistent_readonly() ? 1 : 0,
              static_cast<unsigned long long>(persistent_max_bytes()));
  // Racing children start together: each waits for the moment its parent named.
  if (const char* start = std::getenv("LAZYRT_PCACHE_START_NS")) {
    const std::chrono::system_clock::time_point at{std::chrono::nanoseconds(std::atoll(start))};
    std::this_thread::sleep_until(at);
  }
  const int repeat = std::atoi(child);
  for (int rep = 0; rep < repeat; ++rep) {
    clear_memory();  // every repetition goes to disk again
    for (const auto& [name, values] : run_workload()) {
      std::printf("RESULT %d %s", rep, name.c_str());
      for (double v : values) std::printf(" %.17g", v);
      std::printf("\n");
    }
  }
  for (const char* c : kCounters)
    std::printf("COUNTER %s %lld\n", c, static_cast<long long>(metrics::counter(c)));
  std::fflush(stdout);
}

// Starts the child with this environment (every cache variable is set explicitly, so the
// parent's environment cannot leak in, and generated code is off: these tests count the
// graph entries, not the code the object cache keeps beside them); read its output with
// finish().
class Child {
 public:
  Child(const std::map<std::string, std::string>& env, int repeat = 1) {
    std::map<std::string, std::string> all = {{"LAZYRT_CACHE_DIR", ""},
                                              {"LAZYRT_CACHE_READONLY", "0"},
                                              {"LAZYRT_CACHE_MAX_BYTES", "0"},
                                              {"LAZYRT_JIT", "0"}};
    for (const auto& [k, v] : env) all[k] = v;
    std::string cmd = "env";
    for (const auto& [k, v] : all) cmd += " " + k + "='" + v + "'";
    cmd += " LAZYRT_PCACHE_CHILD=" + std::to_string(repeat) + " /proc/" +
           std::to_string(getpid()) +
           "/exe --gtest_filter=PersistentCacheChild.RunsTheWorkload 2>&1";
    pipe_ = popen(cmd.c_str(), "r");
  }
  ~Child() {
    if (pipe_) pclose(pipe_);
  }
  ChildOutput finish() {
    ChildOutput out;
    if (!pipe_) return out;
    std::array<char, 4096> buf;
    while (fgets(buf.data(), buf.size(), pipe_)) out.raw += buf.data();
    out.status = pclose(pipe_);
    pipe_ = nullptr;
    std::istringstream lines(out.raw);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream in(line);
      std::string tag;
      in >> tag;
      if (tag == "CONFIG") {
        out.config = line.substr(7);
      } else if (tag == "RESULT") {
        size_t rep;
        std::string name;
        in >> rep >> name;
        if (out.results.size() <= rep) out.results.resize(rep + 1);
        double v;
        auto& values = out.results[rep][name];
        while (in >> v) values.push_back(v);
      } else if (tag == "COUNTER") {
        std::string name;
        int64_t v;
        in >> name >> v;
        out.counters[name] = v;
      }
    }
    return out;
  }

 private:
  FILE* pipe_ = nullptr;
};

ChildOutput run_child(const std::map<std::string, std::string>& env, int repeat = 1) {
  return Child(env, repeat).finish();
}

// ---- in-process tests: the fixture points the process's cache at a fresh directory --------
// (with generated code off, whatever LAZYRT_JIT says, as in the children)

class PersistentCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jit::set_mode(jit::Mode::Off);
    set_persistent_max_bytes(0);
    set_persistent_dir(dir_.path());
    clear_memory();
    metrics::reset();
  }
  void TearDown() override {
    set_persistent_dir("");
    set_persistent_max_bytes(0);
    clear_memory();
    jit::set_mode(saved_mode_);
  }
  // A fresh start as far as caching goes: nothing in memory, counters at zero.
  static void forget() {
    clear_memory();
    metrics::reset();
  }
  static int64_t count(const char* name) { return metrics::counter(name); }
  std::string entry_path(const GraphHash& key) const {
    return dir_.path() + "/" + entry_file_name(key);
  }

  TempDir dir_;
  jit::Mode saved_mode_ = jit::mode();
};

// relu(x @ w + 1).sum() for x of shape [n, 3]: a graph per n, with a known value.
struct Probe {
  Tensor x, w, y;
  explicit Probe(int n = 2) {
    std::vector<float> xs;
    for (int i = 0; i < n * 3; ++i) xs.push_back(static_cast<float>(i % 5) - 1);
    x = tensor(xs, {n, 3});
    w = tensor({0.5, -1, 2}, {3, 1});
    y = relu(matmul(x, w) + 1.0).sum();
    key = graph_hash({y});
    expected = 0;
    for (int r = 0; r < n; ++r) {
      double z = 1;
      for (int k = 0; k < 3; ++k) z += xs[r * 3 + k] * (k == 0 ? 0.5 : k == 1 ? -1 : 2);
      expected += z > 0 ? z : 0;
    }
  }
  double run() const { return y.item(); }
  GraphHash key;  // the cache key its sync uses
  double expected;
};

TEST_F(PersistentCacheTest, MissCompilesAndWritesThenAHitSkipsCompilation) {
  Probe first;
  const GraphHash key = first.key;
  EXPECT_EQ(first.run(), first.expected);
  EXPECT_EQ(count("PersistentCacheMiss"), 1);
  EXPECT_EQ(count("UncachedCompile"), 1);
  EXPECT_EQ(count("PersistentCacheHit"), 0);
  EXPECT_EQ(files_in(dir_.path()), std::vector<std::string>{entry_file_name(key)});
  EXPECT_EQ(entry_file_name(key).substr(0, 33), key.to_string() + "-");

  forget();
  Probe second;
  EXPECT_EQ(second.run(), second.expected);
  EXPECT_EQ(count("PersistentCacheHit"), 1);
  EXPECT_EQ(count("UncachedCompile"), 0);
  EXPECT_EQ(count("PersistentCacheMiss"), 0);

  // In memory now: the disk is not consulted again.
  metrics::reset();
  Probe third;
  EXPECT_EQ(third.run(), third.expected);
  EXPECT_EQ(count("CachedCompile"), 1);
  EXPECT_EQ(count("PersistentCacheHit"), 0);
}

TEST_F(PersistentCacheTest, TheEntryHoldsTheOptimizedGraph) {
  Tensor x = tensor({1, 2}, {2});
  Tensor y = (x * 1.0 + 0.0) * 2.0;  // the passes drop the * 1 and the + 0
  const GraphHash key = graph_hash({y});
  const ir::Graph traced = trace::pending_graph({trace::impl_of(y)});
  y.to_vector<float>();
  CacheEntry entry = decode_entry(read_file(entry_path(key)));
  EXPECT_EQ(entry.key, key);
  EXPECT_LT(entry.graph.nodes.size(), traced.nodes.size());
  EXPECT_EQ(interface_mismatch(traced, entry.graph), "");
}

TEST_F(PersistentCacheTest, SetPersistentDirConfiguresAndEmptyTurnsItOff) {
  EXPECT_EQ(persistent_dir(), dir_.path());
  EXPECT_FALSE(persistent_readonly());
  set_persistent_dir("");
  EXPECT_EQ(persistent_dir(), "");
  EXPECT_EQ(persistent_cache(), nullptr);
  Probe p;
  EXPECT_EQ(p.run(), p.expected);
  EXPECT_EQ(count("PersistentCacheMiss") + count("PersistentCacheHit"), 0);
  EXPECT_TRUE(files_in(dir_.path()).empty());
}

TEST_F(PersistentCacheTest, CreatesAMissingDirectory) {
  const std::string nested = dir_.path() + "/a/b/c";
  set_persistent_dir(nested);
  Probe p;
  EXPECT_EQ(p.run(), p.expected);
  EXPECT_EQ(files_in(nested).size(), 1u);
}

// ---- bad files: each is counted, ignored, and replaced ------------------------------------

struct BadFile {
  const char* name;
  // Puts something bad at `path`, where `good` (a valid entry for the probe) was.
  std::function<void(const std::string& path, const std::string& good)> make;
  bool replaceable = true;
};

std::string patched(std::string bytes, size_t at, std::string_view with) {
  bytes.replace(at, with.size(), with);
  return bytes;
}

std::string u32_bytes(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

std::vector<BadFile> bad_files() {
  namespace f = entry_format;
  auto replace_with = [](auto fn) {
    return [fn](const std::string& path, const std::string& good) { write_file(path, fn(good)); };
  };
  return {
      {"Empty", replace_with([](const std::string&) { return std::string(); })},
      {"TruncatedHeader", replace_with([](const std::string& g) { return g.substr(0, 20); })},
      {"TruncatedBody", replace_with([](const std::string& g) { return g.substr(0, g.size() - 7); })},
      {"FlippedBodyByte", replace_with([](std::string g) {
         g[f::kHeaderBytes + (g.size() - f::kHeaderBytes) / 2] ^= 0x10;
         return g;
       })},
      {"FlippedChecksum", replace_with([](std::string g) {
         g[f::kChecksumAt] ^= 1;
         return g;
       })},
      {"WrongMagic", replace_with([](const std::string& g) { return patched(g, 0, "XLACACHE"); })},
      {"WrongFormatVersion", replace_with([](const std::string& g) {
         return patched(g, f::kVersionAt, u32_bytes(f::kVersion + 1));
       })},
      {"WrongIrVersion", replace_with([](const std::string& g) {
         return patched(g, f::kIrVersionAt, u32_bytes(ir::kIrFormatVersion + 1));
       })},
      {"WrongLibraryVersion", replace_with([](const std::string& g) {
         return patched(g, f::kLibraryVersionAt, std::string("99.0.0") + std::string(10, '\0'));
       })},
      {"WrongCpuFingerprint", replace_with([](std::string g) {
         g[f::kCpuFingerprintAt + 7] ^= 0x40;
         return g;
       })},
      {"ExtraBytes", replace_with([](const std::string& g) { return g + "tail"; })},
      {"Garbage", replace_with([](const std::string&) {
         std::mt19937 rng(1);
         std::string s(4096, '\0');
         for (char& c : s) c = static_cast<char>(rng());
         return s;
       })},
      {"GarbageBodyWithAValidHeader", replace_with([](const std::string& g) {
         CacheEntry e = decode_entry(g);
         return seal_entry(e.key, "this is not a graph");
       })},
      {"EntryOfAnotherGraph", replace_with([](const std::string&) {
         // A valid entry, copied or renamed to the wrong name.
         Probe other(7);
         ir::Graph g = trace::pending_graph({trace::impl_of(other.y)});
         return encode_entry({other.key, std::vector<int32_t>(g.outputs.size(), -1), g});
       })},
      {"ValidEntryThatDoesNotFitTheGraph", replace_with([](const std::string& good) {
         // The right key and a checksum that matches, but a graph over other shapes: a
         // planted or hash-colliding entry must not run on this graph's buffers.
         Probe other(7);
         ir::Graph g = trace::pending_graph({trace::impl_of(other.y)});
         return encode_entry({decode_entry(good).key, std::vector<int32_t>(g.outputs.size(), -1), g});
       })},
      {"ValidEntryWhoseConstantsCannotBeAllocated", replace_with([](const std::string& good) {
         // Fits the graph and passes every check of the format, but its constants add up to
         // more than memory can hold: 32 of the largest the format allows (2^56 f64 elements,
         // 2^59 bytes), whose sum wraps a 64-bit byte count to 0.
         CacheEntry e = decode_entry(good);
         ir::Graph& g = e.graph;
         ir::ValueRef out = g.outputs[0];
         for (int i = 0; i < 32; ++i) {
           ir::ValueRef huge = g.add_full(1.0, {int64_t{1} << 56}, DType::f64);
           ir::ValueRef total = g.add(ir::OpKind::Sum, {huge}, {std::vector<int64_t>{0}, false});
           out = g.add(ir::OpKind::Add, {out, g.add(ir::OpKind::Cast, {total}, {DType::f32})});
         }
         g.outputs[0] = out;
         return encode_entry(e);
       })},
      {"EmptyDirectory", [](const std::string& path, const std::string&) {
         fs::remove(path);
         fs::create_directory(path);
       }},
      {"NonEmptyDirectory", [](const std::string& path, const std::string&) {
         fs::remove(path);
         fs::create_directory(path);
         write_file(path + "/keep", "not ours to delete");
       }, false},
      {"DanglingSymlink", [](const std::string& path, const std::string&) {
         fs::remove(path);
         fs::create_symlink(path + ".missing", path);
       }},
      {"SymlinkLoop", [](const std::string& path, const std::string&) {
         fs::remove(path);
         fs::create_symlink(path, path);
       }},
      {"Fifo", [](const std::string& path, const std::string&) {
         fs::remove(path);
         ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);  // opening it must not block
       }},
  };
}

void PrintTo(const BadFile& bad, std::ostream* os) { *os << bad.name; }

class PersistentCacheBadFile : public PersistentCacheTest,
                               public ::testing::WithParamInterface<BadFile> {};

TEST_P(PersistentCacheBadFile, IsCountedIgnoredAndReplaced) {
  Probe probe;
  const std::string path = entry_path(probe.key);
  ASSERT_EQ(probe.run(), probe.expected);
  const std::string good = read_file(path);
  ASSERT_NO_THROW(decode_entry(good));
  GetParam().make(path, good);

  forget();
  Probe again;
  EXPECT_EQ(again.run(), again.expected);
  EXPECT_EQ(count("PersistentCacheDeserializeFailure"), 1);
  EXPECT_EQ(count("PersistentCacheHit"), 0);
  EXPECT_EQ(count("PersistentCacheMiss"), 0);
  EXPECT_EQ(count("UncachedCompile"), 1);

  forget();
  Probe third;
  EXPECT_EQ(third.run(), third.expected);
  if (GetParam().replaceable) {
    EXPECT_EQ(decode_entry(read_file(path)).key, probe.key);
    EXPECT_EQ(count("PersistentCacheHit"), 1) << "the bad file was replaced by a good entry";
  } else {
    EXPECT_EQ(count("PersistentCacheDeserializeFailure"), 1) << "still refused, never trusted";
    EXPECT_EQ(read_file(path + "/keep"), "not ours to delete");
  }
  for (const std::string& name : files_in(dir_.path()))
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "temporary file left behind: " << name;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, PersistentCacheBadFile, ::testing::ValuesIn(bad_files()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(PersistentCacheTest, EverySingleByteFlipOrTruncationIsRefused) {
  Probe probe;
  const GraphHash key = probe.key;
  const ir::Graph traced = trace::pending_graph({trace::impl_of(probe.y)});
  ASSERT_EQ(probe.run(), probe.expected);
  const std::string path = entry_path(key);
  const std::string good = read_file(path);
  const std::vector<int32_t> donations = decode_entry(good).donations;
  const PersistentCache reader(dir_.path(), /*readonly=*/true, 0);
  ASSERT_EQ(reader.load(key, traced, donations).status, PersistentCache::Status::Hit);
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t bit : {0x01, 0x80}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ bit);
      write_file(path, bad);
      EXPECT_EQ(reader.load(key, traced, donations).status, PersistentCache::Status::Bad)
          << "byte " << i << " flipped by " << int{bit};
    }
  }
  for (size_t n = 0; n < good.size(); ++n) {
    write_file(path, good.substr(0, n));
    EXPECT_EQ(reader.load(key, traced, donations).status, PersistentCache::Status::Bad)
        << "truncated to " << n << " bytes";
  }
}

TEST_F(PersistentCacheTest, BuildsWithOtherCpusOrVersionsKeepTheirOwnEntries) {
  Probe p;
  ASSERT_EQ(p.run(), p.expected);
  const std::string ours = entry_path(p.key);
  // What a host with another CPU would write for the same graph: its own name, its own header.
  std::string theirs_bytes = read_file(ours);
  theirs_bytes[entry_format::kCpuFingerprintAt + 7] ^= 0x40;
  const std::string theirs = dir_.path() + "/" + p.key.to_string() + "-0badf00d.lzc";
  write_file(theirs, theirs_bytes);

  forget();
  Probe again;
  EXPECT_EQ(again.run(), again.expected);
  EXPECT_EQ(count("PersistentCacheHit"), 1);
  EXPECT_EQ(count("PersistentCacheDeserializeFailure"), 0);
  EXPECT_EQ(read_file(theirs), theirs_bytes);
  EXPECT_NE(ours, theirs);
}

TEST_F(PersistentCacheTest, AnUnwritableDirectoryOnlyCostsTheWrite) {
  const std::string not_a_dir = dir_.path() + "/file";
  write_file(not_a_dir, "a file where the cache directory should be");
  set_persistent_dir(not_a_dir);
  Probe p;
  EXPECT_EQ(p.run(), p.expected);
  EXPECT_EQ(count("UncachedCompile"), 1);
  EXPECT_EQ(count("PersistentCacheMiss"), 1);
  const PersistentCache cache(not_a_dir, false, 0);
  std::string why;
  Probe q(3);
  ir::Graph g = trace::pending_graph({trace::impl_of(q.y)});
  EXPECT_FALSE(cache.store({q.key, {-1}, g}, &why));
  EXPECT_THAT(why, HasSubstr("cannot create"));
}

// ---- read-only mode ---------------------------------------------------------------------

TEST_F(PersistentCacheTest, ReadOnlyModeWritesNothing) {
  set_persistent_dir(dir_.path(), /*readonly=*/true);
  EXPECT_TRUE(persistent_readonly());
  Probe p;
  EXPECT_EQ(p.run(), p.expected);
  EXPECT_EQ(count("PersistentCacheMiss"), 1);
  EXPECT_EQ(count("UncachedCompile"), 1);
  EXPECT_TRUE(files_in(dir_.path()).empty());

  // Not even the directory is created.
  const std::string missing = dir_.path() + "/missing";
  set_persistent_dir(missing, true);
  forget();
  Probe q;
  EXPECT_EQ(q.run(), q.expected);
  EXPECT_EQ(count("PersistentCacheMiss"), 1);
  EXPECT_FALSE(fs::exists(missing));
}

TEST_F(PersistentCacheTest, ReadOnlyModeUsesEntriesWithoutTouchingThem) {
  Probe p;
  ASSERT_EQ(p.run(), p.expected);
  const std::string path = entry_path(p.key);
  set_mtime(path, 3600);
  const int64_t before = mtime_ns(path);

  set_persistent_dir(dir_.path(), /*readonly=*/true);
  forget();
  Probe q;
  EXPECT_EQ(q.run(), q.expected);
  EXPECT_EQ(count("PersistentCacheHit"), 1);
  EXPECT_EQ(count("UncachedCompile"), 0);
  EXPECT_EQ(mtime_ns(path), before);

  // Read-write, a hit marks the entry as recently used.
  set_persistent_dir(dir_.path());
  forget();
  Probe r;
  EXPECT_EQ(r.run(), r.expected);
  EXPECT_EQ(count("PersistentCacheHit"), 1);
  EXPECT_GT(mtime_ns(path), before);
}

TEST_F(PersistentCacheTest, ReadOnlyModeLeavesABadEntryAlone) {
  Probe p;
  ASSERT_EQ(p.run(), p.expected);
  const std::string path = entry_path(p.key);
  const std::string corrupt = read_file(path).substr(0, 40);
  write_file(path, corrupt);

  set_persistent_dir(dir_.path(), /*readonly=*/true);
  forget();
  Probe q;
  EXPECT_EQ(q.run(), q.expected);
  EXPECT_EQ(count("PersistentCacheDeserializeFailure"), 1);
  EXPECT_EQ(read_file(path), corrupt);
  EXPECT_EQ(files_in(dir_.path()).size(), 1u);
}

// A file the process may not read. Root reads anything, so there the test has nothing to see.
TEST_F(PersistentCacheTest, AFileWithoutReadPermissionIsABadEntry) {
  if (geteuid() == 0) return;
  Probe p;
  ASSERT_EQ(p.run(), p.expected);
  const std::string path = entry_path(p.key);
  fs::permissions(path, fs::perms::none);
  forget();
  Probe q;
  EXPECT_EQ(q.run(), q.expected);
  EXPECT_EQ(count("PersistentCacheDeserializeFailure"), 1);
  forget();
  Probe r;
  EXPECT_EQ(r.run(), r.expected);
  EXPECT_EQ(count("PersistentCacheHit"), 1) << "replaced by a readable entry";
}

// A directory the process may not write to. Root ignores permissions, so there the test
// checks only that nothing breaks; read-only mode (above) is what guarantees no writes.
TEST_F(PersistentCacheTest, ADirectoryWithoutWritePermissionStillServesHits) {
  Probe p;
  ASSERT_EQ(p.run(), p.expected);
  fs::permissions(dir_.path(), fs::perms::owner_read | fs::perms::owner_exec);
  forget();
  Probe q;
  EXPECT_EQ(q.run(), q.expected);
  EXPECT_EQ(count("PersistentCacheHit"), 1);
  Probe other(4);
  EXPECT_EQ(other.run(), other.expected);
  EXPECT_EQ(count("UncachedCompile"), 1);
  fs::permissions(dir_.path(), fs::perms::owner_all);
}

// ---- eviction ---------------------------------------------------------------------------

TEST_F(PersistentCacheTest, EvictionKeepsTheEntriesUnderTheCap) {
  Probe first(1);
  ASSERT_EQ(first.run(), first.expected);
  const uint64_t entry = entry_bytes_in(dir_.path());
  ASSERT_GT(entry, 0u);
  const uint64_t cap = entry * 3 + entry / 2;
  set_persistent_max_bytes(cap);
  GraphHash newest;
  for (int n = 2; n <= 12; ++n) {
    Probe p(n);
    newest = p.key;
    EXPECT_EQ(p.run(), p.expected);
    EXPECT_LE(entry_bytes_in(dir_.path()), cap) << "after graph " << n;
  }
  EXPECT_EQ(files_in(dir_.path()).size(), 3u);
  EXPECT_TRUE(fs::exists(entry_path(newest)));
}

TEST_F(PersistentCacheTest, EvictsTheLeastRecentlyUsedAndOnlyItsOwnFiles) {
  std::vector<Probe> probes;
  for (int n = 1; n <= 3; ++n) {
    probes.emplace_back(n);
    ASSERT_EQ(probes.back().run(), probes.back().expected);
  }
  // Written in the order 1, 2, 3, long ago; then 1 is used again.
  for (int i = 0; i < 3; ++i) set_mtime(entry_path(probes[i].key), 3000 - 100 * i);
  forget();
  Probe again(1);
  ASSERT_EQ(again.run(), again.expected);
  ASSERT_EQ(count("PersistentCacheHit"), 1);

  const uint64_t three_entries = entry_bytes_in(dir_.path());
  // An entry another build (another CPU or library version) wrote, used even longer ago: it
  // counts towards the cap and is evicted first.
  const std::string other_build = dir_.path() + "/" + probes[0].key.to_string() + "-00000000.lzc";
  write_file(other_build, read_file(entry_path(probes[0].key)));
  set_mtime(other_build, 4000);
  const std::string stale_temp = dir_.path() + "/." + probes[0].key.to_string() + ".1.dead.tmp";
  const std::string fresh_temp = dir_.path() + "/." + probes[0].key.to_string() + ".2.live.tmp";
  const std::string foreign = dir_.path() + "/README";
  write_file(stale_temp, "left by a writer that crashed");
  set_mtime(stale_temp, 2 * 3600);
  write_file(fresh_temp, "being written right now");
  write_file(foreign, "not a cache file");

  set_persistent_max_bytes(three_entries);
  Probe fourth(4);
  ASSERT_EQ(fourth.run(), fourth.expected);
  EXPECT_FALSE(fs::exists(other_build)) << "least recently used of all";
  EXPECT_TRUE(fs::exists(entry_path(probes[0].key))) << "recently hit";
  EXPECT_FALSE(fs::exists(entry_path(probes[1].key))) << "least recently used";
  EXPECT_TRUE(fs::exists(entry_path(probes[2].key)));
  EXPECT_TRUE(fs::exists(entry_path(fourth.key)));
  EXPECT_FALSE(fs::exists(stale_temp));
  EXPECT_TRUE(fs::exists(fresh_temp));
  EXPECT_TRUE(fs::exists(foreign));
}

// ---- processes ----------------------------------------------------------------------------

TEST(PersistentCacheProcesses, ASecondProcessSkipsCompilationAndGetsIdenticalResults) {
  TempDir dir;
  const ChildOutput a = run_child({{"LAZYRT_CACHE_DIR", dir.path()}});
  ASSERT_EQ(a.status, 0) << a.raw;
  ASSERT_EQ(a.results.size(), 1u) << a.raw;
  expect_matches_expected(a.results[0], "process A");
  EXPECT_EQ(a.counters.at("PersistentCacheMiss"), kWorkloadGraphs) << a.raw;
  EXPECT_EQ(a.counters.at("UncachedCompile"), kWorkloadGraphs) << a.raw;
  EXPECT_EQ(a.counters.at("PersistentCacheHit"), 0) << a.raw;
  EXPECT_EQ(files_in(dir.path()).size(), static_cast<size_t>(kWorkloadGraphs));

  const ChildOutput b = run_child({{"LAZYRT_CACHE_DIR", dir.path()}});
  ASSERT_EQ(b.status, 0) << b.raw;
  ASSERT_EQ(b.results.size(), 1u) << b.raw;
  EXPECT_GE(b.counters.at("PersistentCacheHit"), 1) << b.raw;
  EXPECT_EQ(b.counters.at("PersistentCacheHit"), kWorkloadGraphs) << b.raw;
  EXPECT_EQ(b.counters.at("UncachedCompile"), 0) << b.raw;
  EXPECT_EQ(b.counters.at("PersistentCacheMiss"), 0) << b.raw;
  EXPECT_EQ(b.counters.at("PersistentCacheDeserializeFailure"), 0) << b.raw;
  EXPECT_EQ(b.results[0], a.results[0]) << "process B computed something else than A";
}

TEST(PersistentCacheProcesses, EnvironmentConfiguresTheCacheAndItIsOffByDefault) {
  TempDir dir;
  const ChildOutput off = run_child({});
  ASSERT_EQ(off.status, 0) << off.raw;
  EXPECT_EQ(off.config, "dir= readonly=0 max=0");
  EXPECT_EQ(off.counters.at("PersistentCacheMiss") + off.counters.at("PersistentCacheHit"), 0);
  expect_matches_expected(off.results.at(0), "no cache");

  const ChildOutput on = run_child({{"LAZYRT_CACHE_DIR", dir.path()},
                                    {"LAZYRT_CACHE_READONLY", "yes"},
                                    {"LAZYRT_CACHE_MAX_BYTES", "2K"}});
  ASSERT_EQ(on.status, 0) << on.raw;
  EXPECT_EQ(on.config, "dir=" + dir.path() + " readonly=1 max=2048");
  EXPECT_EQ(on.counters.at("PersistentCacheMiss"), kWorkloadGraphs);
  EXPECT_TRUE(files_in(dir.path()).empty()) << "read-only from the environment too";

  const ChildOutput bad_cap = run_child({{"LAZYRT_CACHE_DIR", dir.path()},
                                         {"LAZYRT_CACHE_MAX_BYTES", "lots"}});
  ASSERT_EQ(bad_cap.status, 0) << bad_cap.raw;
  EXPECT_THAT(bad_cap.raw, HasSubstr("LAZYRT_CACHE_MAX_BYTES=lots is not a byte count"));
  EXPECT_EQ(bad_cap.config, "dir=" + dir.path() + " readonly=0 max=0");
}

// Checks what several racing processes leave behind: only whole, valid entries.
void expect_only_valid_entries(const std::string& dir) {
  for (const std::string& name : files_in(dir)) {
    CacheEntry entry;
    ASSERT_NO_THROW(entry = decode_entry(read_file(dir + "/" + name))) << "unexpected file " << name;
    EXPECT_EQ(name, entry_file_name(entry.key));
  }
}

void race(const std::string& dir, uint64_t max_bytes) {
  constexpr int kProcesses = 8;
  constexpr int kRepeats = 8;
  const auto start = std::chrono::system_clock::now() + std::chrono::milliseconds(500);
  const std::string start_ns = std::to_string(
      std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count());
  std::vector<std::unique_ptr<Child>> children;
  for (int i = 0; i < kProcesses; ++i)
    children.push_back(std::make_unique<Child>(
        std::map<std::string, std::string>{{"LAZYRT_CACHE_DIR", dir},
                                           {"LAZYRT_CACHE_MAX_BYTES", std::to_string(max_bytes)},
                                           {"LAZYRT_PCACHE_START_NS", start_ns}},
        kRepeats));
  int64_t hits = 0;
  for (int i = 0; i < kProcesses; ++i) {
    const ChildOutput out = children[i]->finish();
    const std::string who = "process " + std::to_string(i);
    ASSERT_EQ(out.status, 0) << who << "\n" << out.raw;
    ASSERT_EQ(out.results.size(), static_cast<size_t>(kRepeats)) << who << "\n" << out.raw;
    for (int rep = 0; rep < kRepeats; ++rep)
      expect_matches_expected(out.results[rep], who + " repetition " + std::to_string(rep));
    EXPECT_EQ(out.counters.at("PersistentCacheDeserializeFailure"), 0) << who << "\n" << out.raw;
    EXPECT_EQ(out.counters.at("PersistentCacheHit") + out.counters.at("PersistentCacheMiss"),
              kRepeats * kWorkloadGraphs) << who;
    hits += out.counters.at("PersistentCacheHit");
  }
  EXPECT_GT(hits, 0) << "the processes never shared an entry";
  expect_only_valid_entries(dir);
}

TEST(PersistentCacheProcesses, EightProcessesRacingOnOneDirectoryLeaveOnlyValidEntries) {
  TempDir dir;
  race(dir.path(), 0);
  EXPECT_EQ(files_in(dir.path()).size(), static_cast<size_t>(kWorkloadGraphs));
}

TEST(PersistentCacheProcesses, EightProcessesRacingWhileEvictingStayCorrectAndUnderTheCap) {
  TempDir dir;
  // Room for about two of the four entries: the processes keep evicting each other's.
  const ChildOutput sizing = run_child({{"LAZYRT_CACHE_DIR", dir.path()}});
  ASSERT_EQ(sizing.status, 0) << sizing.raw;
  const uint64_t cap = entry_bytes_in(dir.path()) / 2;
  for (const std::string& name : files_in(dir.path())) fs::remove(dir.path() + "/" + name);
  race(dir.path(), cap);
  EXPECT_LE(entry_bytes_in(dir.path()), cap);
}

// Found by make fuzz (entry_parser_fuzz): a scan_vjp node whose operand counts, read from a
// file, are negative; the verifier took them as sizes, whose sum wrapped around and passed its
// check, and read past the node's operands. Now refused by name, as any bad entry is.
TEST(PersistentCacheEntry, AScanVjpWithNegativeCountsIsRefused) {
  // The fuzzer's input, its body sealed with a valid header and checksum as the fuzzer does.
  const std::string input = read_file(std::string(LAZYRT_SOURCE_DIR) + "/tests/fixtures/cache/scan_vjp_negative_counts.entry");
  const std::string file = seal_entry({1, 2}, std::string_view(input).substr(entry_format::kHeaderBytes));
  try {
    (void)decode_entry(file);
    FAIL() << "the entry was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("must count its"));
  }
}

}  // namespace
}  // namespace lazyrt::cache
