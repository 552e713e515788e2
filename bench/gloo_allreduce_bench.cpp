// Gloo's own all-reduce, used directly from C++: the rate lazyrt's collectives are measured
// against (bench/distributed.py). The group is joined as src/distributed joins its own (Gloo's
// TCP device on 127.0.0.1, or on the interface GLOO_SOCKET_IFNAME names; a full mesh of
// connections), here through Gloo's FileStore rendezvous in a directory; the all-reduce is
// gloo::allreduce, in place, with Gloo's own gloo::sum<float> (what torch.distributed's gloo
// backend passes it for a sum).
//
// Built twice from this file (bench/CMakeLists.txt):
// - libgloo_allreduce_bench.so, a C interface that bench/distributed.py loads with ctypes, so
//   that one process times lazyrt's all-reduce and Gloo's in turn, under the same load (in place,
//   and from an input buffer into an output buffer);
// - gloo_allreduce, a program to run by hand, one process per rank:
//     gloo_allreduce --store DIR --rank R --size N [--count 1000000] [--calls 10] [--reps 5]
//   every rank prints the median seconds per all-reduce and the rate of the tensor's bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>

namespace {

struct Group {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::chrono::milliseconds timeout;
};

void set_error(char* error, size_t len, const std::string& what) {
  if (error && len) {
    std::snprintf(error, len, "%s", what.c_str());
  }
}

}  // namespace

extern "C" {

// Joins a group of `size` processes meeting in the directory `store_dir` (made if missing); null
// on failure, with the reason in error.
void* lazyrt_gloo_bench_init(const char* store_dir, int rank, int size, double timeout_s, char* error,
                             size_t error_len) {
  try {
    gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface) attr.iface = iface;
    else attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto g = std::make_unique<Group>();
    g->timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1e3));
    g->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    g->ctx->setTimeout(g->timeout);
    ::mkdir(store_dir, 0777);  // Gloo's FileStore needs the directory (any rank may make it)
    gloo::rendezvous::FileStore store(store_dir);
    gloo::rendezvous::PrefixStore prefixed("gloo_allreduce_bench", store);
    g->ctx->connectFullMesh(prefixed, device);
    return g.release();
  } catch (const std::exception& e) {
    set_error(error, error_len, e.what());
    return nullptr;
  }
}

// `calls` all-reduces (sum) of in[0, count) into out[0, count), one after the other: in place
// when in is out (or null), else Gloo's ring reads in and writes out. The seconds per call, or -1
// on failure (the reason in error).
double lazyrt_gloo_bench_allreduce_into(void* group, float* in, float* out, size_t count, int calls, char* error,
                                        size_t error_len) {
  auto* g = static_cast<Group*>(group);
  try {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      gloo::AllreduceOptions opts(g->ctx);
      if (in && in != out) opts.setInput<float>(in, count);
      opts.setOutput<float>(out, count);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTimeout(g->timeout);
      gloo::allreduce(opts);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
  } catch (const std::exception& e) {
    set_error(error, error_len, e.what());
    return -1;
  }
}

// `calls` all-reduces (sum) of data[0, count) in place.
double lazyrt_gloo_bench_allreduce(void* group, float* data, size_t count, int calls, char* error, size_t error_len) {
  return lazyrt_gloo_bench_allreduce_into(group, data, data, count, calls, error, error_len);
}

int lazyrt_gloo_bench_barrier(void* group, char* error, size_t error_len) {
  auto* g = static_cast<Group*>(group);
  try {
    gloo::BarrierOptions opts(g->ctx);
    opts.setTimeout(g->timeout);
    gloo::barrier(opts);
    return 0;
  } catch (const std::exception& e) {
    set_error(error, error_len, e.what());
    return -1;
  }
}

void lazyrt_gloo_bench_destroy(void* group) { delete static_cast<Group*>(group); }

}  // extern "C"

#ifdef LAZYRT_GLOO_BENCH_MAIN
int main(int argc, char** argv) {
  std::string store;
  int rank = -1, size = -1, calls = 10, reps = 5;
  size_t count = 1000000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--store") store = v;
    else if (k == "--rank") rank = std::atoi(v.c_str());
    else if (k == "--size") size = std::atoi(v.c_str());
    else if (k == "--count") count = static_cast<size_t>(std::atof(v.c_str()));
    else if (k == "--calls") calls = std::atoi(v.c_str());
    else if (k == "--reps") reps = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (store.empty() || rank < 0 || size < 1 || rank >= size || calls < 1 || reps < 1) {
    std::fprintf(stderr, "usage: %s --store DIR --rank R --size N [--count 1e6] [--calls 10] [--reps 5]\n", argv[0]);
    return 2;
  }
  char error[512] = {0};
  void* g = lazyrt_gloo_bench_init(store.c_str(), rank, size, 60.0, error, sizeof error);
  if (!g) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error);
    return 1;
  }
  std::vector<float> data(count, static_cast<float>(rank + 1));
  // The first call checks the sum, and warms up.
  if (lazyrt_gloo_bench_allreduce(g, data.data(), count, 1, error, sizeof error) < 0) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error);
    return 1;
  }
  const float expected = static_cast<float>(size) * static_cast<float>(size + 1) / 2;
  if (count && (data.front() != expected || data.back() != expected)) {
    std::fprintf(stderr, "rank %d: the sum is %g, not %g\n", rank, data.front(), expected);
    return 1;
  }
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const double s = lazyrt_gloo_bench_allreduce(g, data.data(), count, calls, error, sizeof error);
    if (s < 0) {
      std::fprintf(stderr, "rank %d: %s\n", rank, error);
      return 1;
    }
    seconds.push_back(s);
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::printf("rank %d of %d: %zu floats, %.3f ms per all-reduce (median of %d x %d), %.2f GB/s\n", rank, size, count,
              median * 1e3, reps, calls, 4.0 * static_cast<double>(count) / median / 1e9);
  // No rank closes its connections while another still reads from them.
  const int rc = lazyrt_gloo_bench_barrier(g, error, sizeof error);
  if (rc != 0) std::fprintf(stderr, "rank %d: %s\n", rank, error);
  lazyrt_gloo_bench_destroy(g);
  return rc == 0 ? 0 : 1;
}
#endif
