// Process groups and collectives across real processes: each test forks its ranks, which join
// a group (a file store, or the TCP store rank 0 serves), run collectives on known values and
// check them against closed forms, reporting through their exit status. The parent waits with
// a deadline and kills what is left: a hang fails the test, never blocks the suite.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <lazyrt/lazyrt.h>

#include "compile/compile.h"
#include "ir/graph.h"
#include "trace/lazy_tensor.h"

namespace lazyrt {
namespace {

namespace dist = distributed;
using Clock = std::chrono::steady_clock;

std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("lazyrt_pg_" + name + "_" + std::to_string(::getpid()) + "_" +
              std::to_string(Clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The options of rank `rank` of `world` meeting in the store directory `dir`.
dist::InitOptions file_store(const std::string& dir, int rank, int world, std::chrono::seconds timeout) {
  dist::InitOptions o;
  o.init_method = "file://" + dir;
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  return o;
}

// A port nobody listens on now (rank 0 binds it again).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : 29400;
}

// Runs body(rank) in `world` forked processes; returns each one's exit status (-1: killed at
// the deadline). A rank reports a failed check as a message on stderr and status 1.
std::vector<int> run_ranks(int world, const std::function<int(int)>& body, std::chrono::seconds deadline = std::chrono::seconds(60)) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> status(world, -1);
  const auto end = Clock::now() + deadline;
  for (int left = world; left > 0 && Clock::now() < end;) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] == 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[r] = 0;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (pid_t p : pids)
    if (p) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  return status;
}

#define RANK_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "rank check failed at line %d: %s\n", __LINE__, #cond);  \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

// Rank r's contribution: element i is (i % 5 - 2) * (r + 1) + r.
std::vector<float> contribution(int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i % 5 - 2) * (r + 1) + r);
  return v;
}

int collectives_body(int r, int world, const dist::InitOptions& o) {
  dist::init_process_group(o);
  RANK_CHECK(dist::get_rank() == r && dist::get_world_size() == world);
  const int64_t rows = 2 * world, cols = 3, n = rows * cols;
  const Tensor x = tensor(contribution(r, n), {rows, cols});
  const Tensor sum = dist::all_reduce(x);
  const Tensor mean = dist::all_reduce(x * 1.0, dist::ReduceOp::Mean);
  const Tensor mx = dist::all_reduce(x, dist::ReduceOp::Max);
  const Tensor mn = dist::all_reduce(x, dist::ReduceOp::Min);
  const Tensor gathered = dist::all_gather(x);
  const Tensor scattered = dist::reduce_scatter(x);
  const Tensor bcast = dist::broadcast(x, world - 1);
  mark_step();
  const auto s = sum.to_vector<float>(), me = mean.to_vector<float>(), ma = mx.to_vector<float>(),
             mi = mn.to_vector<float>(), g = gathered.to_vector<float>(), sc = scattered.to_vector<float>(),
             b = bcast.to_vector<float>();
  RANK_CHECK((gathered.shape() == Shape{rows * world, cols}) && (scattered.shape() == Shape{rows / world, cols}));
  for (int64_t i = 0; i < n; ++i) {
    // Closed forms over the ranks q = 0 .. world-1 of (i % 5 - 2)(q + 1) + q.
    const double a = static_cast<double>(i % 5 - 2);
    const double total = a * world * (world + 1) / 2.0 + world * (world - 1) / 2.0;
    double top = -1e300, bottom = 1e300;
    for (int q = 0; q < world; ++q) {
      top = std::max(top, a * (q + 1) + q);
      bottom = std::min(bottom, a * (q + 1) + q);
    }
    RANK_CHECK(s[i] == static_cast<float>(total));
    RANK_CHECK(std::abs(me[i] - total / world) < 1e-5);
    RANK_CHECK(ma[i] == static_cast<float>(top) && mi[i] == static_cast<float>(bottom));
    RANK_CHECK(b[i] == contribution(world - 1, n)[i]);
  }
  for (int q = 0; q < world; ++q) {
    const auto xq = contribution(q, n);
    for (int64_t i = 0; i < n; ++i) RANK_CHECK(g[q * n + i] == xq[i]);
  }
  const int64_t part = n / world;
  for (int64_t i = 0; i < part; ++i) RANK_CHECK(sc[i] == s[r * part + i]);
  dist::barrier();
  dist::destroy_process_group();
  RANK_CHECK(!dist::is_initialized());
  return 0;
}

TEST(ProcessGroup, CollectivesOverAFileStore) {
  for (int world : {2, 3}) {
    const std::string dir = fresh_dir("file");
    const auto status = run_ranks(world, [&](int r) {
      return collectives_body(r, world, file_store(dir, r, world, std::chrono::seconds(20)));
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(status[r], 0) << "rank " << r << " of " << world;
    std::filesystem::remove_all(dir);
  }
}

TEST(ProcessGroup, CollectivesOverTheTcpStore) {
  const int world = 4;
  const int port = free_port();
  const auto status = run_ranks(world, [&](int r) {
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("RANK", std::to_string(r).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    dist::InitOptions o;
    o.timeout = std::chrono::seconds(20);
    return collectives_body(r, world, o);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A rank that dies: every other rank's collective fails with lazyrt::Error well within the
// timeout (its connections closed), and the group refuses what comes after.
TEST(ProcessGroup, ADeadRankIsAnErrorOnTheOthers) {
  const int world = 3;
  const std::string dir = fresh_dir("dead");
  const auto t0 = Clock::now();
  const auto status = run_ranks(world, [&](int r) {
    dist::init_process_group(file_store(dir, r, world, std::chrono::seconds(10)));
    dist::barrier();  // every rank has joined
    if (r == 1) ::_exit(9);
    const Tensor y = dist::all_reduce(tensor(contribution(r, 100), {100}));
    try {
      y.to_vector<float>();
      return 2;  // no error
    } catch (const Error& e) {
      const std::string m = e.what();
      RANK_CHECK(m.find("all_reduce on rank " + std::to_string(r) + " of 3") != std::string::npos);
      RANK_CHECK(m.find("a peer process died") != std::string::npos);
    }
    // The failed run wrote nothing: y is still pending.
    RANK_CHECK(y.is_pending());
    try {
      dist::barrier();
      return 3;
    } catch (const Error& e) {
      RANK_CHECK(std::string(e.what()).find("failed earlier") != std::string::npos);
    }
    dist::destroy_process_group();
    return 0;
  });
  EXPECT_EQ(status[1], 9);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[2], 0);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(25));
  std::filesystem::remove_all(dir);
}

// A rank that never joins: the others give up after the timeout, naming the rendezvous.
TEST(ProcessGroup, ARankThatNeverJoinsTimesOut) {
  const std::string dir = fresh_dir("absent");
  const auto t0 = Clock::now();
  const auto status = run_ranks(1, [&](int) {
    try {
      dist::init_process_group(file_store(dir, 0, 2, std::chrono::seconds(2)));
      return 2;
    } catch (const Error& e) {
      RANK_CHECK(std::string(e.what()).find("init_process_group: rank 0 of 2 could not") != std::string::npos);
    }
    RANK_CHECK(!dist::is_initialized());
    return 0;
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(15));
  std::filesystem::remove_all(dir);
}

// The graph of a collective: ordered by its token, the group's size as an attribute, the rank
// nowhere; so the hash is every rank's.
TEST(ProcessGroup, CollectiveGraphsDoNotDependOnTheRank) {
  const int world = 2;
  const std::string dir = fresh_dir("hash");
  const std::string out = dir + "/hashes";
  std::filesystem::create_directories(out);
  const auto status = run_ranks(world, [&](int r) {
    dist::init_process_group(file_store(dir, r, world, std::chrono::seconds(20)));
    const Tensor x = tensor(contribution(r, 8), {8});
    const Tensor a = dist::all_reduce(x);
    const Tensor b = dist::all_gather(a * 2.0);
    std::vector<std::shared_ptr<trace::TensorImpl>> ts{trace::impl_of(b)};
    const ir::Graph g = trace::pending_graph(ts);
    int collectives = 0;
    ir::ValueRef last_token{-1, 0};
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const ir::Node& n = g.nodes[i];
      if (!ir::has_flag(n.op, ir::kCollective)) continue;
      ++collectives;
      // Each takes the token of the one before.
      if (last_token.node >= 0) RANK_CHECK(n.operands[1] == last_token);
      last_token = {static_cast<int32_t>(i), 1};
    }
    RANK_CHECK(collectives == 2);
    const GraphHash h = ir::hash_graph(g);
    FILE* f = std::fopen((out + "/" + std::to_string(r)).c_str(), "w");
    std::fprintf(f, "%016llx%016llx", static_cast<unsigned long long>(h.hi), static_cast<unsigned long long>(h.lo));
    std::fclose(f);
    mark_step();
    dist::destroy_process_group();
    return 0;
  });
  ASSERT_EQ(status[0], 0);
  ASSERT_EQ(status[1], 0);
  auto read = [&](int r) {
    std::string s(32, ' ');
    FILE* f = std::fopen((out + "/" + std::to_string(r)).c_str(), "r");
    const size_t n = std::fread(s.data(), 1, 32, f);
    std::fclose(f);
    return s.substr(0, n);
  };
  EXPECT_EQ(read(0), read(1));
  EXPECT_EQ(read(0).size(), 32u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lazyrt

namespace lazyrt {
namespace {

// A gradient bucket that dies at its all_reduce is reduced where it lies: the collective's
// result takes its operand's arena slot (no copy), while its token gets a slot of its own.
TEST(ProcessGroup, AllReduceReducesADyingOperandInPlace) {
  ir::Graph g;
  const ir::ValueRef a = g.add_parameter({DType::f32, {1024}});
  const ir::ValueRef b = g.add_parameter({DType::f32, {1024}});
  const ir::ValueRef bucket = g.add(ir::OpKind::Concat, {a, b}, {int64_t{0}});
  const ir::ValueRef reduced =
      g.add(ir::OpKind::AllReduce, {bucket, g.add_full(0, {}, DType::b8)}, {int64_t{1}, int64_t{2}, int64_t{0}});
  g.outputs = {g.add(ir::OpKind::Slice, {reduced}, {std::vector<int64_t>{0}, std::vector<int64_t>{1024},
                                                    std::vector<int64_t>{1}})};
  const std::string text = compile::compile(g)->to_text();
  std::string line;
  for (size_t at = 0, end; at < text.size(); at = end + 1) {
    end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    if (text.substr(at, end - at).find("all_reduce(") != std::string::npos) line = text.substr(at, end - at);
  }
  ASSERT_FALSE(line.empty()) << text;
  // "5: all_reduce(arena+X, ...) -> arena+X, arena+Y"
  const size_t open = line.find('(') + 1, arrow = line.find("-> ") + 3;
  const std::string in = line.substr(open, line.find(',', open) - open);
  const std::string out = line.substr(arrow, line.find(',', arrow) - arrow);
  EXPECT_EQ(in.rfind("arena", 0), 0u) << line;
  EXPECT_EQ(in, out) << line;
}

// The steps of an executable, one line each.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0, end; at < text.size(); at = end + 1) {
    end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(at, end - at));
  }
  return out;
}

ir::ValueRef add_all_reduce(ir::Graph& g, ir::ValueRef x, ir::ValueRef token) {
  return g.add(ir::OpKind::AllReduce, {x, token}, {int64_t{0}, int64_t{2}, int64_t{0}});
}

// The result of the graph's last collective is written straight into its output: a tensor
// reduced in place (`t.copy_(all_reduce(t))`, its buffer donated to the result) is reduced in
// its own buffer, a new result in the output's, and no copy of the whole tensor follows. The
// result of an earlier collective and the other outputs computed before the last collective are
// still computed aside and copied in after it, so a failed collective leaves them as they were.
TEST(ProcessGroup, TheLastCollectiveWritesItsResultStraightIntoItsOutput) {
  {
    ir::Graph g;
    const ir::ValueRef t = g.add_parameter({DType::f32, {4096}});
    const ir::ValueRef reduced = add_all_reduce(g, t, g.add_full(0, {}, DType::b8));
    g.outputs = {reduced};
    const auto exe = compile::compile(g, {0});
    EXPECT_TRUE(exe->donation_accepted(0));
    const std::vector<std::string> steps = lines_of(exe->to_text());
    ASSERT_EQ(steps.size(), 1u) << exe->to_text();
    EXPECT_EQ(steps[0].rfind("0: all_reduce(param 0, ", 0), 0u) << steps[0];
    EXPECT_NE(steps[0].find("-> out 0, arena"), std::string::npos) << steps[0];
    // Not donated: a new tensor, written where the caller puts it (the ring reads the parameter).
    const std::string fresh = compile::compile(g)->to_text();
    EXPECT_EQ(fresh.rfind("0: all_reduce(param 0, const+0) -> out 0, arena", 0), 0u) << fresh;
    EXPECT_EQ(fresh.find("reshape("), std::string::npos) << fresh;
  }
  {
    // Two tensors reduced in place, one collective each, and a value computed before them; and
    // the same with the second collective's result a new tensor (no donation).
    ir::Graph g;
    const ir::ValueRef a = g.add_parameter({DType::f32, {4096}});
    const ir::ValueRef b = g.add_parameter({DType::f32, {4096}});
    const ir::ValueRef before = g.add(ir::OpKind::Neg, {a});
    const ir::ValueRef first = add_all_reduce(g, a, g.add_full(0, {}, DType::b8));
    const ir::ValueRef second = add_all_reduce(g, b, {first.node, 1});
    g.outputs = {first, second, before};
    for (const std::vector<int32_t>& donations : {std::vector<int32_t>{0, 1, -1}, std::vector<int32_t>{0, -1, -1}}) {
      const std::string text = compile::compile(g, donations)->to_text();
      const std::vector<std::string> steps = lines_of(text);
      std::string first_line, second_line;
      size_t second_at = 0, first_copy_at = 0;
      int copies = 0;
      for (size_t i = 0; i < steps.size(); ++i) {
        const std::string& l = steps[i];
        if (l.find("all_reduce(param 0") != std::string::npos) first_line = l;
        if (l.find("all_reduce(param 1") != std::string::npos) second_line = l, second_at = i;
        if (l.find("reshape(") != std::string::npos && !copies++) first_copy_at = i;
      }
      EXPECT_NE(second_line.find("-> out 1, arena"), std::string::npos) << text;
      EXPECT_NE(first_line.find("-> arena"), std::string::npos) << text;
      EXPECT_NE(text.find("-> out 0\n"), std::string::npos) << text;
      EXPECT_NE(text.find("-> out 2\n"), std::string::npos) << text;
      EXPECT_EQ(copies, 2) << text;  // outputs 0 and 2
      EXPECT_GT(first_copy_at, second_at) << text;  // copied in after the last collective
    }
  }
}

}  // namespace
}  // namespace lazyrt
