#include "distributed/process_group.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <mutex>
#include <sys/stat.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "distributed/tcp_store.h"
#include "lazyrt/distributed.h"
#include "runtime/collective.h"
#include "util/check.h"
#include "util/dtype_dispatch.h"

namespace lazyrt::distributed {
namespace {

using lazyrt::detail::str_cat;

// The slot prefix of reduce_scatter's ring (Gloo's own collectives use small prefixes).
constexpr uint8_t kReduceScatterSlotPrefix = 0x4c;

template <class T>
void reduce_into(ir::ReduceOp op, T* c, const T* a, const T* b, size_t n) {
  using C = compute_t<T>;
  switch (op) {
    case ir::ReduceOp::Sum:
    case ir::ReduceOp::Mean:
      for (size_t i = 0; i < n; ++i) c[i] = convert<T>(convert<C>(a[i]) + convert<C>(b[i]));
      break;
    case ir::ReduceOp::Max:
      // nan wins, as in torch's max
      for (size_t i = 0; i < n; ++i) {
        const C x = convert<C>(a[i]), y = convert<C>(b[i]);
        c[i] = convert<T>(x != x || x > y ? x : y);
      }
      break;
    case ir::ReduceOp::Min:
      for (size_t i = 0; i < n; ++i) {
        const C x = convert<C>(a[i]), y = convert<C>(b[i]);
        c[i] = convert<T>(x != x || x < y ? x : y);
      }
      break;
    case ir::ReduceOp::kCount: break;
  }
}

template <class T>
void divide(T* data, size_t n, int by) {
  using C = compute_t<T>;
  if constexpr (std::is_floating_point_v<C>)
    for (size_t i = 0; i < n; ++i) data[i] = convert<T>(convert<C>(data[i]) / static_cast<C>(by));
}

// fn(T{}) for the element type T of a dtype the reductions take (every one but bool: the op
// rows refuse b8 operands).
template <class Fn>
void visit_reducible(DType dtype, Fn&& fn) {
  visit_dtype(dtype, [&](auto tag) {
    if constexpr (!std::is_same_v<decltype(tag), bool>) fn(tag);
  });
}

class GlooGroup final : public runtime::Communicator {
 public:
  GlooGroup(std::shared_ptr<gloo::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }

  void all_reduce(const void* in, void* out, size_t count, DType dtype, ir::ReduceOp op) override {
    guarded("all_reduce", [&] {
      if (ctx_->size == 1) {
        if (in != out) std::memcpy(out, in, count * dtype_size(dtype));
        return;
      }
      visit_reducible(dtype, [&](auto tag) {
        using T = decltype(tag);
        gloo::AllreduceOptions opts(ctx_);
        // An input apart from the output: Gloo's ring reads it segment by segment as it sends
        // (no copy of the whole operand first), and writes only the output.
        if (in != out) opts.setInput<T>(static_cast<T*>(const_cast<void*>(in)), count);
        opts.setOutput<T>(static_cast<T*>(out), count);
        opts.setReduceFunction([op](void* c, const void* a, const void* b, size_t n) {
          reduce_into<T>(op, static_cast<T*>(c), static_cast<const T*>(a), static_cast<const T*>(b), n);
        });
        opts.setTimeout(timeout_);
        gloo::allreduce(opts);
        if (op == ir::ReduceOp::Mean) divide(static_cast<T*>(out), count, ctx_->size);
      });
    });
  }

  void all_gather(const void* in, void* out, size_t bytes) override {
    guarded("all_gather", [&] {
      if (ctx_->size == 1) {
        std::memcpy(out, in, bytes);
        return;
      }
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput<char>(static_cast<char*>(const_cast<void*>(in)), bytes);
      opts.setOutput<char>(static_cast<char*>(out), bytes * static_cast<size_t>(ctx_->size));
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  // A ring over Gloo's point-to-point buffers: at step s rank r sends part r - s - 1 (mod
  // size) to its right and adds the part r - s - 2 its left sends into its own; after size - 1
  // steps part r holds every rank's contribution.
  void reduce_scatter(void* data, void* out, size_t count, DType dtype, ir::ReduceOp op) override {
    guarded("reduce_scatter", [&] {
      const size_t es = dtype_size(dtype), part = count * es;
      const int n = ctx_->size, r = ctx_->rank;
      if (n > 1) {
        scratch_.resize(part);
        auto send = ctx_->createUnboundBuffer(data, part * static_cast<size_t>(n));
        auto recv = ctx_->createUnboundBuffer(scratch_.data(), part);
        const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, 0);
        const int right = (r + 1) % n, left = (r + n - 1) % n;
        for (int s = 0; s + 1 < n; ++s) {
          const int send_part = ((r - s - 1) % n + n) % n, recv_part = ((r - s - 2) % n + n) % n;
          send->send(right, slot, static_cast<size_t>(send_part) * part, part);
          recv->recv(left, slot, 0, part);
          if (!recv->waitRecv(timeout_)) throw Error("the receive was aborted");
          char* mine = static_cast<char*>(data) + static_cast<size_t>(recv_part) * part;
          visit_reducible(dtype, [&](auto tag) {
            using T = decltype(tag);
            reduce_into<T>(op, reinterpret_cast<T*>(mine), reinterpret_cast<const T*>(mine),
                           reinterpret_cast<const T*>(scratch_.data()), count);
          });
          if (!send->waitSend(timeout_)) throw Error("the send was aborted");
        }
      }
      std::memcpy(out, static_cast<char*>(data) + static_cast<size_t>(r) * part, part);
      if (op == ir::ReduceOp::Mean)
        visit_reducible(dtype, [&](auto tag) { divide(static_cast<decltype(tag)*>(out), count, n); });
    });
  }

  void broadcast(void* data, size_t bytes, int src) override {
    guarded("broadcast", [&] {
      if (ctx_->size == 1) return;
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput<char>(static_cast<char*>(data), bytes);
      opts.setRoot(src);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void barrier() {
    guarded("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // One collective at a time; after a failure every later one refuses at once. A rank that
  // sees a failure closes its connections, so ranks waiting on it fail now rather than at
  // their timeout.
  template <class F>
  void guarded(std::string_view what, F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    LAZYRT_CHECK(failure_.empty(), what, ": the process group failed earlier (", failure_,
                 "); destroy_process_group() and initialize a new one");
    try {
      f();
    } catch (const std::exception& e) {
      failure_ = str_cat(what, " on rank ", ctx_->rank, " of ", ctx_->size, ": a peer process died, failed or did not answer within ",
                         timeout_.count(), " ms (", e.what(), ")");
      for (int i = 0; i < ctx_->size; ++i) {
        if (i == ctx_->rank) continue;
        try {
          if (auto& pair = ctx_->getPair(i)) pair->close();
        } catch (...) {
        }
      }
      throw Error(failure_);
    }
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::string failure_;
  std::vector<char> scratch_;
};

struct State {
  int rank = 0, size = 1, local_rank = 0;
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<GlooGroup> group;
};

std::mutex state_mu;
std::unique_ptr<State> state;
int generation = 0;  // the number of groups this process initialized

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, const char* what) {
  const char* v = env(name);
  LAZYRT_CHECK(v, "init_process_group: ", name, " is not set (", what,
               "; python3 -m lazyrt.distributed.run sets it, as torchrun does)");
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  LAZYRT_CHECK(errno == 0 && end && *end == 0 && x >= 0 && x <= 1 << 24, "init_process_group: ", name, "='", v,
               "' is not a non-negative integer");
  return static_cast<int>(x);
}

bool loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

State& initialized(std::string_view op) {
  LAZYRT_CHECK(state != nullptr, op, ": no process group is initialized in this process: call init_process_group() first");
  return *state;
}

}  // namespace

void init_process_group(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(state_mu);
  LAZYRT_CHECK(state == nullptr, "init_process_group: a process group is already initialized (rank ", state ? state->rank : 0,
               " of ", state ? state->size : 0, "); destroy_process_group() first");
  LAZYRT_CHECK(options.timeout.count() > 0, "init_process_group: the timeout must be positive, got ",
               options.timeout.count(), " ms");
  const std::string& method = options.init_method;
  const bool from_env = method.empty() || method == "env://";
  const std::string file_prefix = "file://", tcp_prefix = "tcp://";
  const bool from_tcp = method.rfind(tcp_prefix, 0) == 0;
  LAZYRT_CHECK(from_env || from_tcp || method.rfind(file_prefix, 0) == 0, "init_process_group: init_method '", method,
               "' is not supported (expected 'env://', 'tcp://host:port' or 'file:///a/directory')");
  auto st = std::make_unique<State>();
  st->rank = options.rank >= 0 ? options.rank : env_int("RANK", "this process's rank");
  st->size = options.world_size >= 0 ? options.world_size : env_int("WORLD_SIZE", "the number of processes");
  st->local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK", "the rank on this host") : 0;
  LAZYRT_CHECK(st->size >= 1, "init_process_group: the world size must be at least 1, got ", st->size);
  LAZYRT_CHECK(st->rank < st->size, "init_process_group: rank ", st->rank, " is not in [0, ", st->size, ")");

  std::unique_ptr<gloo::rendezvous::Store> store;
  std::string host = "127.0.0.1";
  if (from_env || from_tcp) {
    // env://: MASTER_ADDR and MASTER_PORT; tcp://host:port names them (as torch's init_method).
    std::string addr;
    int port = 0;
    if (from_tcp) {
      const std::string rest = method.substr(tcp_prefix.size());
      const size_t colon = rest.rfind(':');
      char* end = nullptr;
      const long p = colon == std::string::npos ? -1 : std::strtol(rest.c_str() + colon + 1, &end, 10);
      LAZYRT_CHECK(colon != std::string::npos && colon > 0 && end && *end == 0 && p >= 1 && p <= 65535,
                   "init_process_group: init_method '", method, "' is not 'tcp://host:port'");
      addr = rest.substr(0, colon);
      port = static_cast<int>(p);
    } else {
      const char* a = env("MASTER_ADDR");
      LAZYRT_CHECK(a, "init_process_group: MASTER_ADDR is not set (the host of rank 0, which serves the rendezvous)");
      addr = a;
      port = env_int("MASTER_PORT", "the port rank 0 serves the rendezvous on");
      LAZYRT_CHECK(port >= 1 && port <= 65535, "init_process_group: MASTER_PORT=", port, " is not a port");
    }
    if (st->rank == 0) st->server = std::make_unique<TcpStoreServer>(port);
    store = std::make_unique<TcpStore>(addr, port, options.timeout);
    if (!loopback(addr)) {
      char name[256] = {0};
      if (::gethostname(name, sizeof name - 1) == 0) host = name;
    }
  } else {
    const std::string dir = method.substr(file_prefix.size());
    LAZYRT_CHECK(!dir.empty(), "init_process_group: init_method '", method, "' names no directory");
    ::mkdir(dir.c_str(), 0777);
    struct stat sb{};
    LAZYRT_CHECK(::stat(dir.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode), "init_process_group: the store directory '", dir,
                 "' does not exist and cannot be made");
    store = std::make_unique<gloo::rendezvous::FileStore>(dir);
  }
  // A write to a peer that died raises SIGPIPE, whose default action ends the process: the
  // ranks that survive must see an error instead (Python ignores SIGPIPE already; a handler
  // the program installed is left as it is).
  struct sigaction pipe_action {};
  if (::sigaction(SIGPIPE, nullptr, &pipe_action) == 0 && pipe_action.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  gloo::transport::tcp::attr attr;
  if (const char* iface = env("GLOO_SOCKET_IFNAME")) attr.iface = iface;
  else attr.hostname = host;
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(st->rank, st->size);
    ctx->setTimeout(options.timeout);
    gloo::rendezvous::PrefixStore prefixed(str_cat("lazyrt/", generation), *store);
    ctx->connectFullMesh(prefixed, device);
    st->group = std::make_shared<GlooGroup>(ctx, options.timeout);
  } catch (const Error& e) {
    throw Error(str_cat("init_process_group: rank ", st->rank, " of ", st->size, " could not join the group: ", e.what()));
  } catch (const std::exception& e) {
    throw Error(str_cat("init_process_group: rank ", st->rank, " of ", st->size,
                        " could not connect to the other ranks within ", options.timeout.count(), " ms: ", e.what()));
  }
  ++generation;
  runtime::set_communicator(0, st->group);
  state = std::move(st);
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(state_mu);
  return state != nullptr;
}

int get_rank() {
  std::lock_guard<std::mutex> lock(state_mu);
  return initialized("get_rank").rank;
}

int get_world_size() {
  std::lock_guard<std::mutex> lock(state_mu);
  return initialized("get_world_size").size;
}

int get_local_rank() {
  std::lock_guard<std::mutex> lock(state_mu);
  return initialized("get_local_rank").local_rank;
}

void barrier() {
  std::shared_ptr<GlooGroup> g;
  {
    std::lock_guard<std::mutex> lock(state_mu);
    g = initialized("barrier").group;
  }
  g->barrier();
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(state_mu);
  initialized("destroy_process_group");
  runtime::set_communicator(0, nullptr);
  state.reset();
}

namespace detail {

int world_size_for(std::string_view op) {
  std::lock_guard<std::mutex> lock(state_mu);
  return initialized(op).size;
}

}  // namespace detail

}  // namespace lazyrt::distributed
