// Generated code in the persistent cache: a module compiled once is stored, and the next
// compilation of the same regions loads it instead of compiling (and computes the same
// values); a corrupt file is a miss; a directory writable by others is refused, for loading
// and storing alike.
#include <gtest/gtest.h>

#include <lazyrt/lazyrt.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backend/cpu/kernels/ops.h"
#include "jit/jit.h"
#include "support/graphs.h"

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
  std::vector<float> run() const {
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
    if (e.path().extension() == ".o") out.push_back(e.path());
  return out;
}

struct SyncMode {
  jit::Mode saved = jit::mode();
  SyncMode() { jit::set_mode(jit::Mode::Tiered); }
  ~SyncMode() { jit::set_mode(saved); }
};

TEST(ObjectCache, ASecondCompilationLoadsTheStoredObject) {
  SyncMode mode;
  TempCacheDir dir;
  const Region r;
  const int64_t hits = metrics::counter("JitObjectCacheHits");
  EXPECT_EQ(r.run(), expected());
  ASSERT_EQ(objects(dir.path).size(), 1u) << "the compiled module is stored";
  EXPECT_EQ(metrics::counter("JitObjectCacheHits"), hits);
  EXPECT_EQ(r.run(), expected());
  EXPECT_EQ(metrics::counter("JitObjectCacheHits"), hits + 1) << "loaded, not compiled";
  EXPECT_EQ(objects(dir.path).size(), 1u);
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

}  // namespace
}  // namespace lazyrt
