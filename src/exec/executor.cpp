#include "exec/executor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "backend/backend.h"
#include "cache/memory_cache.h"
#include "cache/persistent_cache.h"
#include "compile/compile.h"
#include "ir/hash.h"
#include "lazyrt/debug.h"
#include "lazyrt/metrics.h"
#include "util/metrics_cells.h"
#include "util/timer.h"

namespace lazyrt::exec {
namespace {

struct DumpSetting {
  std::mutex mu;
  std::string dir;
  bool warned = false;
  DumpSetting() {
    if (const char* d = std::getenv("LAZYRT_DUMP_GRAPH")) dir = d;
  }
};
DumpSetting& dump_setting() {
  static DumpSetting* s = new DumpSetting();
  return *s;
}

// LAZYRT_DUMP_GRAPH: the graph an executable was made from, as text and DOT.
void dump(const GraphHash& key, const runtime::Executable& exe) {
  DumpSetting& s = dump_setting();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.dir.empty()) return;
  const std::string base = s.dir + "/" + key.to_string();
  std::ofstream txt(base + ".txt"), dot(base + ".dot");
  txt << ir::to_text(exe.graph()) << "\n" << exe.to_text();
  dot << ir::to_dot(exe.graph());
  txt.close();
  dot.close();
  if ((!txt || !dot) && !s.warned) {
    s.warned = true;
    std::fprintf(stderr, "lazyrt: LAZYRT_DUMP_GRAPH: cannot write %s.txt/.dot; graphs are not dumped\n",
                 base.c_str());
  }
}

}  // namespace

GraphHash cache_key(const ir::Graph& graph, const std::vector<int32_t>& donations) {
  return cache_key(ir::hash_graph(graph), donations);
}

GraphHash cache_key(const GraphHash& gh, const std::vector<int32_t>& donations) {
  ir::Hasher h;
  h.add(gh.hi);
  h.add(gh.lo);
  h.add(backend::current().fingerprint());
  for (int32_t d : donations) h.add(static_cast<uint64_t>(static_cast<int64_t>(d)));
  return h.finish();
}

namespace {

// From disk: the stored optimized graph, lowered. Counts the lookup's outcome; null unless
// it was a hit.
std::shared_ptr<runtime::Executable> load_from_disk(const cache::PersistentCache& disk, const ir::Graph& graph,
                                                    const std::vector<int32_t>& donations, const GraphHash& key) {
  cache::PersistentCache::Lookup found = disk.load(key, graph, donations);
  std::shared_ptr<runtime::Executable> exe;
  if (found.status == cache::PersistentCache::Status::Hit) {
    try {
      exe = compile::lower(found.entry.graph, donations);
    } catch (const std::exception& e) {  // a verified graph no kernel takes: refuse the entry
      found.status = cache::PersistentCache::Status::Bad;
      found.error = std::string("lowering its graph failed: ") + e.what();
    }
  }
  switch (found.status) {
    case cache::PersistentCache::Status::Hit: metrics::increment("PersistentCacheHit"); break;
    case cache::PersistentCache::Status::Miss: metrics::increment("PersistentCacheMiss"); break;
    case cache::PersistentCache::Status::Bad:
      metrics::increment("PersistentCacheDeserializeFailure");
      disk.warn_bad_entry(key, found.error);
      break;
  }
  return exe;
}

}  // namespace

std::shared_ptr<runtime::Executable> cached_executable(const GraphHash& key) {
  std::shared_ptr<runtime::Executable> exe = cache::memory_cache().get(key);
  if (exe) {
    static auto& cached_compile = metrics::detail::counter_cell("CachedCompile");
    cached_compile.add(1);
  }
  return exe;
}

std::shared_ptr<runtime::Executable> executable_for(const GraphHash& key, const ir::Graph& graph,
                                                    const std::vector<int32_t>& donations) {
  if (std::shared_ptr<runtime::Executable> exe = cached_executable(key)) return exe;
  static auto& compile_time = metrics::detail::timing_cell("CompileTime");
  detail::ScopedTimer timer(compile_time);
  const std::shared_ptr<const cache::PersistentCache> disk = cache::persistent_cache();
  std::shared_ptr<runtime::Executable> exe = disk ? load_from_disk(*disk, graph, donations, key) : nullptr;
  if (!exe) {
    exe = compile::compile(graph, donations);
    static auto& uncached_compile = metrics::detail::counter_cell("UncachedCompile");
    uncached_compile.add(1);
    // A bad entry is replaced here too: store writes over whatever is at the path.
    if (disk) disk->store({key, donations, exe->graph()});
  }
  cache::memory_cache().put(key, exe);
  dump(key, *exe);
  return exe;
}

void copy_box(const void* src, const Shape& from, void* dst, const Shape& to, const Shape& box, size_t esize) {
  const size_t rank = box.size();
  if (std::any_of(box.begin(), box.end(), [](int64_t n) { return n == 0; })) return;
  if (rank == 0) {
    std::memcpy(dst, src, esize);
    return;
  }
  // Byte strides of both arrays; rows of the last dim are copied whole.
  std::vector<size_t> sf(rank), st(rank);
  sf[rank - 1] = st[rank - 1] = esize;
  for (size_t d = rank - 1; d-- > 0;) {
    sf[d] = sf[d + 1] * static_cast<size_t>(from[d + 1]);
    st[d] = st[d + 1] * static_cast<size_t>(to[d + 1]);
  }
  const size_t row = static_cast<size_t>(box[rank - 1]) * esize;
  std::vector<int64_t> at(rank, 0);
  const auto* s = static_cast<const char*>(src);
  auto* t = static_cast<char*>(dst);
  for (;;) {
    size_t of = 0, ot = 0;
    for (size_t d = 0; d + 1 < rank; ++d) {
      of += static_cast<size_t>(at[d]) * sf[d];
      ot += static_cast<size_t>(at[d]) * st[d];
    }
    std::memcpy(t + ot, s + of, row);
    size_t d = rank - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++at[d] < box[d]) break;
      at[d] = 0;
    }
  }
}

BufferPtr padded_copy(const runtime::Buffer& src, const ir::TensorType& t, const compile::Box& box) {
  const ir::TensorType to{t.dtype, box.padded};
  BufferPtr out = backend::current().allocate(to.bytes());
  std::memset(out->data(), 0, out->bytes());
  copy_box(src.data(), box.traced, out->data(), box.padded, box.traced, dtype_size(t.dtype));
  return out;
}

BufferPtr cropped_copy(const runtime::Buffer& src, const compile::Box& box, const ir::TensorType& t) {
  BufferPtr out = backend::current().allocate(t.bytes());
  copy_box(src.data(), box.padded, out->data(), box.traced, box.traced, dtype_size(t.dtype));
  return out;
}

void execute(runtime::Executable& exe, const void* const* params, void* const* outs,
             metrics::detail::CounterCell& counter) {
  {
    static auto& execute_time = metrics::detail::timing_cell("ExecuteTime");
    detail::ScopedTimer timer(execute_time);
    try {
      exe.run(params, outs);
    } catch (const std::bad_alloc&) {  // a kernel that allocates scratch of its own
      throw Error("out of memory while running a graph");
    }
  }
  counter.add(1);
}

}  // namespace lazyrt::exec

namespace lazyrt::debug {

void set_dump_graph_dir(const std::string& dir) {
  auto& s = exec::dump_setting();
  std::lock_guard<std::mutex> lock(s.mu);
  s.dir = dir;
  s.warned = false;
}

std::string dump_graph_dir() {
  auto& s = exec::dump_setting();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.dir;
}

}  // namespace lazyrt::debug
