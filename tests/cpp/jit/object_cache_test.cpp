// Generated code in the persistent cache, and the compiler process: a module compiled once is
// stored, and the next compilation of the same regions loads it without asking the compiler
// (and computes the same values); a corrupt file is a miss; a directory writable by others is
// refused, for loading and storing alike. The compiler runs in a process of its own: this
// process never maps LLVM, and a compiler that was killed is replaced.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/jit/code_server.h"
#include "backend/cpu/jit/jit.h"
#include "support/graphs.h"
#include "support/run_graph.h"

namespace lazyrt {
namespace {

namespace fs = std::filesystem;

struct TempCacheDir {
  std::string path;
  std::string saved = cache::persistent_dir();
  bool saved_readonly = cache::persistent_readonly();
  TempCacheDir() {
    std::string tmpl = (fs::temp_directory_path() / "lazyrt-objcache-XXXXXX").string();
    path = mkdtemp(tmpl.data());
    cache::set_persistent_dir(path);
  }
  ~TempCacheDir() {
    cache::set_persistent_dir(saved, saved_readonly);
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
};

// x * 3 + y, over f32[n], as a fusion region.
struct Region {
  ir::Graph g;
  std::vector<ir::TensorType> inputs{{DType::f32, {300}}, {DType::f32, {300}}};
  std::vector<ir::TensorType> outputs;
  Region() {
    auto x = g.add_parameter(inputs[0]);
    auto y = g.add_parameter(inputs[1]);
    g.outputs.push_back(g.add(ir::OpKind::Add, {g.add(ir::OpKind::Mul, {x, g.add_full(3.0, {}, DType::f32)}), y}));
    outputs.push_back(g.type(g.outputs[0]));
  }
  // Compiles the region as a module of its own; returns its kernel's result on fixed operands.
  std::vector<float> run(const std::function<void()>& while_loaded = {}) const {
    auto module = jit::new_module();
    kernels::Kernel k = kernels::make_fused(g, inputs, outputs, testing::plain_fusion(outputs), module);
    jit::compile_now(*module);
    EXPECT_NE(module->fn(0), nullptr);
    std::vector<float> x(300), y(300), out(300);
    for (int i = 0; i < 300; ++i) {
      x[i] = static_cast<float>(i) * 0.25f;
      y[i] = static_cast<float>(300 - i);
    }
    const void* in[] = {x.data(), y.data()};
    void* o[] = {out.data()};
    k.run(in, o);
    if (while_loaded) while_loaded();
    return out;
  }
};

std::vector<float> expected() {
  std::vector<float> e(300);
  for (int i = 0; i < 300; ++i) e[i] = static_cast<float>(i) * 0.25f * 3.0f + static_cast<float>(300 - i);
  return e;
}

std::vector<fs::path> objects(const std::string& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir + "/jit")) return out;
  for (const auto& e : fs::directory_iterator(dir + "/jit"))
    if (e.path().extension() == ".so") out.push_back(e.path());
  return out;
}

struct SyncMode : testing::JitMode {
  SyncMode() : JitMode(jit::Mode::Tiered) {}
};

TEST(ObjectCache, ASecondCompilationLoadsTheStoredObject) {
  SyncMode mode;
  TempCacheDir dir;
  const Region r;
  const int64_t hits = metrics::counter("JitObjectCacheHits");
  EXPECT_EQ(r.run(), expected());
  ASSERT_EQ(objects(dir.path).size(), 1u) << "the compiled module is stored";
  EXPECT_EQ(metrics::counter("JitObjectCacheHits"), hits);
  const int64_t starts = metrics::counter("JitCompilerStarts");
  EXPECT_EQ(r.run(), expected());
  EXPECT_EQ(metrics::counter("JitObjectCacheHits"), hits + 1) << "loaded, not compiled";
  EXPECT_EQ(metrics::counter("JitCompilerStarts"), starts);
  EXPECT_EQ(objects(dir.path).size(), 1u);
}

TEST(ObjectCache, ATieredModuleLoadsStoredCodeWhenItIsLoweredBeforeAnyRun) {
  TempCacheDir dir;
  const Region r;
  {
    SyncMode mode;
    EXPECT_EQ(r.run(), expected());  // compiled and stored
  }
  const jit::Mode saved = jit::mode();
  jit::set_mode(jit::Mode::Tiered);
  const int64_t hits = metrics::counter("JitObjectCacheHits");
  const int64_t starts = metrics::counter("JitCompilerStarts");
  auto module = jit::new_module();
  kernels::Kernel k = kernels::make_fused(r.g, r.inputs, r.outputs, testing::plain_fusion(r.outputs), module);
  EXPECT_EQ(module->fn(0), nullptr);
  jit::Module::finish(module);
  jit::set_mode(saved);
  EXPECT_NE(module->fn(0), nullptr) << "generated code from the first run";
  EXPECT_EQ(metrics::counter("JitObjectCacheHits"), hits + 1);
  EXPECT_EQ(metrics::counter("JitCompilerStarts"), starts);
  // And with an empty cache, nothing until the module is hot.
  TempCacheDir empty;
  jit::set_mode(jit::Mode::Tiered);
  auto cold = jit::new_module();
  kernels::Kernel k2 = kernels::make_fused(r.g, r.inputs, r.outputs, testing::plain_fusion(r.outputs), cold);
  jit::Module::finish(cold);
  jit::set_mode(saved);
  EXPECT_EQ(cold->fn(0), nullptr);
}

TEST(ObjectCache, ACorruptObjectIsAMissAndIsReplaced) {
  SyncMode mode;
  TempCacheDir dir;
  const Region r;
  EXPECT_EQ(r.run(), expected());
  auto files = objects(dir.path);
  ASSERT_EQ(files.size(), 1u);
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(files[0]) / 2));
    f.put('\x5a');
  }
  const int64_t hits = metrics::counter("JitObjectCacheHits");
  const int64_t stores = metrics::counter("JitObjectCacheStores");
  EXPECT_EQ(r.run(), expected());
  EXPECT_EQ(metrics::counter("JitObjectCacheHits"), hits);
  EXPECT_EQ(metrics::counter("JitObjectCacheStores"), stores + 1) << "compiled and written again";
  EXPECT_EQ(r.run(), expected());
  EXPECT_EQ(metrics::counter("JitObjectCacheHits"), hits + 1);
}

TEST(ObjectCache, ADirectoryOthersMayWriteIsRefused) {
  SyncMode mode;
  TempCacheDir dir;
  const Region r;
  EXPECT_EQ(r.run(), expected());  // stores while the directory is private
  ASSERT_EQ(objects(dir.path).size(), 1u);
  ASSERT_EQ(chmod(dir.path.c_str(), 0777), 0);
  // Another directory in between, so that the check runs again for this one.
  cache::set_persistent_dir("");
  cache::set_persistent_dir(dir.path);
  const int64_t hits = metrics::counter("JitObjectCacheHits");
  const int64_t refused = metrics::counter("JitObjectCacheRefused");
  const int64_t stores = metrics::counter("JitObjectCacheStores");
  EXPECT_EQ(r.run(), expected());
  EXPECT_EQ(metrics::counter("JitObjectCacheHits"), hits) << "not loaded from a world-writable directory";
  EXPECT_EQ(metrics::counter("JitObjectCacheStores"), stores) << "nothing stored there either";
  EXPECT_GE(metrics::counter("JitObjectCacheRefused"), refused + 1);
}

// The pids of this process's children named lazyrt-jitc.
std::vector<pid_t> compilers() {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  while (dirent* e = d ? readdir(d) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    std::getline(stat, line);
    // pid (comm) state ppid ...
    const size_t close = line.rfind(')');
    if (close == std::string::npos || line.find("(lazyrt-jitc)") == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == getpid() && state != 'Z') out.push_back(pid);
  }
  if (d) closedir(d);
  return out;
}

TEST(CompilerProcess, CompilesOutsideThisProcessWhichNeverMapsLlvm) {
  SyncMode mode;
  TempCacheDir dir;  // empty: compiled, not loaded
  const Region r;
  // What this process maps: LLVM, and the code of a module from its private directory.
  auto mapped = [](const char* what) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
      if (line.find(what) != std::string::npos) return true;
    return false;
  };
  bool code_while_loaded = false;
  EXPECT_EQ(r.run([&] { code_while_loaded = mapped("lazyrt-code-"); }), expected());
  EXPECT_TRUE(code_while_loaded) << "the module's code is mapped from its private directory";
  EXPECT_FALSE(mapped("lazyrt-code-")) << "and unmapped with its kernels";
  EXPECT_FALSE(mapped("libLLVM")) << "libLLVM is mapped in the process running the kernels";
  EXPECT_EQ(compilers().size(), 1u) << "one compiler process, a child of this one";
}

TEST(CompilerProcess, CodeLoadsFromMemoryFilesWhereNoDirectoryMayHoldIt) {
  SyncMode mode;
  TempCacheDir dir;
  jit::load_code_from_memory_only(true);
  // Two modules loaded at once (the second a different region, so compiled): each its own
  // memory file, neither mistaken for the other.
  const Region r;
  Region r2;
  r2.g.nodes[static_cast<size_t>(r2.g.outputs[0].node)].op = ir::OpKind::Sub;
  std::vector<float> second, expected2(300);
  for (int i = 0; i < 300; ++i) expected2[i] = static_cast<float>(i) * 0.25f * 3.0f - static_cast<float>(300 - i);
  bool memory_file = false;
  EXPECT_EQ(r.run([&] {
    second = r2.run();
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) memory_file = memory_file || line.find("memfd:lazyrt-kernels") != std::string::npos;
  }), expected());
  jit::load_code_from_memory_only(false);
  EXPECT_EQ(second, expected2);
  EXPECT_TRUE(memory_file) << "the code is mapped from a memory file";
}

TEST(CompilerProcess, AKilledCompilerIsReplaced) {
  SyncMode mode;
  TempCacheDir dir;
  // The killed compiler cannot remove its linking directory: it goes under this one.
  TempCacheDir scratch;
  const char* saved_tmpdir = std::getenv("TMPDIR");
  const std::string saved = saved_tmpdir ? saved_tmpdir : "";
  setenv("TMPDIR", scratch.path.c_str(), 1);
  const Region r;
  EXPECT_EQ(r.run(), expected());
  const std::vector<pid_t> before = compilers();
  ASSERT_EQ(before.size(), 1u);
  ASSERT_EQ(kill(before[0], SIGKILL), 0);
  // What it leaves (its linking directory, named with its pid) is removed here.
  const std::string leftover = "lazyrt-jitc-" + std::to_string(before[0]) + "-";
  for (const std::string& base : {scratch.path, std::string("/tmp")})
    for (const auto& e : fs::directory_iterator(base))
      if (e.path().filename().string().rfind(leftover, 0) == 0) {
        std::error_code ec;
        fs::remove_all(e.path(), ec);
      }
  const int64_t starts = metrics::counter("JitCompilerStarts");
  const int64_t failures = metrics::counter("JitFailures");
  TempCacheDir other;  // so that the module is compiled again
  EXPECT_EQ(r.run(), expected());
  EXPECT_EQ(metrics::counter("JitCompilerStarts"), starts + 1);
  EXPECT_EQ(metrics::counter("JitFailures"), failures);
  const std::vector<pid_t> after = compilers();
  ASSERT_EQ(after.size(), 1u) << "the killed one reaped, one running";
  EXPECT_NE(after[0], before[0]);
  // The running compiler's directory removed under it (as a temporary-file cleaner may): it
  // makes another.
  for (const auto& e : fs::directory_iterator(scratch.path))
    if (e.path().filename().string().rfind("lazyrt-jitc-", 0) == 0) fs::remove_all(e.path());
  {
    TempCacheDir third;
    EXPECT_EQ(r.run(), expected());
    EXPECT_EQ(metrics::counter("JitFailures"), failures);
    EXPECT_EQ(metrics::counter("JitCompilerStarts"), starts + 1);
  }
  if (saved_tmpdir) setenv("TMPDIR", saved.c_str(), 1);
  else unsetenv("TMPDIR");
}

}  // namespace
}  // namespace lazyrt
