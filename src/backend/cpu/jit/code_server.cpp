// The running process's side of the compiler process (code_server.h): the wire format, the
// CPU's fingerprint, starting and talking to lazyrt-jitc, and loading the shared objects it
// makes.
#include "backend/cpu/jit/code_server.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <sstream>
#include <utility>

#include "ir/hash.h"
#include "ir/serialize.h"
#include "backend/cpu/jit/object_cache.h"
#include "util/check.h"
#include "util/metrics_cells.h"

extern char** environ;

namespace lazyrt::jit {
namespace {

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

struct Reader {
  std::string_view s;
  size_t at = 0;
  std::string_view take(size_t n) {
    if (n > s.size() - at) throw Error("generated kernels: a truncated request");
    std::string_view r = s.substr(at, n);
    at += n;
    return r;
  }
  template <class T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
};

}  // namespace

std::string encode_regions(const std::vector<FusedRegion>& regions) {
  std::string s;
  put_u32(s, static_cast<uint32_t>(regions.size()));
  for (const FusedRegion& r : regions) {
    const std::string g = ir::serialize_graph(r.region);
    put_u64(s, g.size());
    s += g;
    put_u32(s, static_cast<uint32_t>(r.inner_strides.size()));
    for (int64_t st : r.inner_strides) put_u64(s, static_cast<uint64_t>(st));
    put_u32(s, r.cond ? 1 : 0);
    if (r.cond) {
      const std::string c = ir::serialize_graph(*r.cond);
      put_u64(s, c.size());
      s += c;
    }
  }
  return s;
}

std::vector<FusedRegion> decode_regions(std::string_view bytes) {
  Reader in{bytes};
  const uint32_t n = in.get<uint32_t>();
  if (n > bytes.size()) throw Error(detail::str_cat("generated kernels: a request with ", n, " regions in ", bytes.size(), " bytes"));
  std::vector<FusedRegion> out(n);
  for (FusedRegion& r : out) {
    const uint64_t len = in.get<uint64_t>();
    r.region = ir::deserialize_graph(in.take(static_cast<size_t>(len)));
    const uint32_t strides = in.get<uint32_t>();
    if (strides > bytes.size()) throw Error(detail::str_cat("generated kernels: a region with ", strides, " strides"));
    for (uint32_t k = 0; k < strides; ++k) r.inner_strides.push_back(static_cast<int64_t>(in.get<uint64_t>()));
    if (in.get<uint32_t>() != 0) {
      const uint64_t cond_len = in.get<uint64_t>();
      r.cond = ir::deserialize_graph(in.take(static_cast<size_t>(cond_len)));
    } else if (strides != r.region.num_params) {
      throw Error(detail::str_cat("generated kernels: a region of ", r.region.num_params, " parameters with ", strides, " strides"));
    }
  }
  if (in.at != bytes.size()) throw Error(detail::str_cat("generated kernels: ", bytes.size() - in.at, " bytes after the request"));
  return out;
}

bool write_frame(int fd, std::string_view bytes) {
  std::string head;
  put_u64(head, bytes.size());
  for (std::string_view part : {std::string_view(head), bytes}) {
    size_t put = 0;
    while (put < part.size()) {
      const ssize_t w = ::send(fd, part.data() + put, part.size() - put, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      put += static_cast<size_t>(w);
    }
  }
  return true;
}

namespace {
bool read_exact(int fd, char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}
}  // namespace

bool read_frame(int fd, std::string& bytes) {
  uint64_t n = 0;
  if (!read_exact(fd, reinterpret_cast<char*>(&n), 8) || n > (uint64_t{1} << 32)) return false;
  bytes.resize(static_cast<size_t>(n));
  return read_exact(fd, bytes.data(), bytes.size());
}

bool write_all(int fd, std::string_view bytes) {
  size_t put = 0;
  while (put < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + put, bytes.size() - put);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    put += static_cast<size_t>(w);
  }
  return true;
}

std::string kernel_name(size_t k) { return "lazyrt_k" + std::to_string(k); }

const std::string& code_fingerprint() {
  static const std::string f = [] {
    std::ostringstream os;
    os << "lazyrt-jit " << kGeneratorVersion << "; LLVM " << LAZYRT_LLVM_VERSION << "; ";
#if defined(__x86_64__) || defined(__i386__)
    // Every leaf LLVM's host detection reads: the vendor, family/model/stepping (leaf 1's eax;
    // its ebx holds the core's APIC id, left out), the feature flags, and XCR0 (the register
    // state the OS saves: whether AVX and AVX-512 may be used).
    unsigned a = 0, b = 0, c = 0, d = 0;
    __cpuid(0, a, b, c, d);
    const unsigned max_leaf = a;
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    os << vendor << std::hex;
    __cpuid(1, a, b, c, d);
    os << " 1:" << a << "," << c << "," << d;
    if (c & (1u << 27)) {  // OSXSAVE: xgetbv is there
      unsigned lo = 0, hi = 0;
      __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      os << " xcr0:" << hi << "," << lo;
    }
    if (max_leaf >= 7) {
      __cpuid_count(7, 0, a, b, c, d);
      os << " 7.0:" << b << "," << c << "," << d;
      const unsigned sub = a;
      if (sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        os << " 7.1:" << a;
      }
    }
    if (max_leaf >= 0xd) {
      __cpuid_count(0xd, 1, a, b, c, d);
      os << " d.1:" << a;
    }
    __cpuid(0x80000000, a, b, c, d);
    if (a >= 0x80000001) {
      __cpuid(0x80000001, a, b, c, d);
      os << " e1:" << c << "," << d;
    }
#else
    // Elsewhere: the kernel's description of the CPU.
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line) && !line.empty()) os << line << ";";
#endif
    return os.str();
  }();
  return f;
}

namespace {

// Where loaded code's files live for the moment between writing and dlopen: a directory of
// this process's own (mode 0700, so no one else can swap a file in), on a file system that
// allows executable mappings. Each file has a name of its own: dlopen returns an already
// loaded library for a name it has seen, so names are never reused while the process lives.
class CodeDir {
 public:
  std::string path_for_next() {
    std::lock_guard<std::mutex> lock(mu_);
    if (dir_.empty()) make();
    return dir_ + "/m" + std::to_string(next_++) + ".so";
  }

 private:
  void make() {
    std::vector<std::string> candidates;
    if (const char* t = std::getenv("TMPDIR"); t && *t) candidates.emplace_back(t);
    candidates.emplace_back("/tmp");
    candidates.emplace_back("/dev/shm");
    std::string tried;
    for (const std::string& c : candidates) {
      struct statvfs vfs {};
      if (statvfs(c.c_str(), &vfs) != 0 || (vfs.f_flag & ST_NOEXEC)) {
        tried += " " + c;
        continue;
      }
      std::string tmpl = c + "/lazyrt-code-XXXXXX";
      if (mkdtemp(tmpl.data())) {
        dir_ = tmpl;
        static std::string* atexit_dir = &dir_;
        std::atexit([] { ::rmdir(atexit_dir->c_str()); });
        return;
      }
      tried += " " + c;
    }
    throw Error(detail::str_cat("generated kernels: no directory to load code from: none of", tried,
                " can be written and mapped executable (set TMPDIR to one that can)"));
  }

  std::mutex mu_;
  std::string dir_;
  uint64_t next_ = 0;
};

CodeDir& code_dir() {
  static CodeDir* d = new CodeDir();  // never destroyed: used by the compiler thread until exit
  return *d;
}

std::atomic<bool> memory_only{false};

// Loaded from a file of the private directory, unlinked once loaded; or null, why set.
std::shared_ptr<void> open_from_dir(const std::string& bytes, std::string& why) {
  std::string path;
  try {
    path = code_dir().path_for_next();
  } catch (const Error& e) {
    why = e.what();
    return nullptr;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    why = "cannot write " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  const bool written = write_all(fd, bytes);
  ::close(fd);
  void* handle = written ? dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!handle) why = written ? dlerror() : "cannot write " + path;
  ::unlink(path.c_str());
  if (!handle) return nullptr;
  return std::shared_ptr<void>(handle, [](void* h) { dlclose(h); });
}

// Where no directory allows executable mappings: an anonymous memory file, loaded through
// /proc/self/fd. Its descriptor stays open while the code is loaded, so that its name is
// never that of another loaded module.
std::shared_ptr<void> open_from_memory(const std::string& bytes, std::string& why) {
  const int fd = ::memfd_create("lazyrt-kernels", MFD_CLOEXEC);
  if (fd < 0) {
    why = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  void* handle = nullptr;
  if (!write_all(fd, bytes)) why = "cannot write a memory file";
  else if (!(handle = dlopen(("/proc/self/fd/" + std::to_string(fd)).c_str(), RTLD_NOW | RTLD_LOCAL))) why = dlerror();
  if (!handle) {
    ::close(fd);
    return nullptr;
  }
  return std::shared_ptr<void>(handle, [fd](void* h) {
    dlclose(h);
    ::close(fd);
  });
}

// A shared object's bytes, loaded: its loops into fns; the result unloads it when released.
std::shared_ptr<void> load_code(const std::string& bytes, size_t n, std::vector<FusedFn>& fns) {
  std::string why_dir = "not tried", why_memory;
  std::shared_ptr<void> code = memory_only.load() ? nullptr : open_from_dir(bytes, why_dir);
  if (!code) code = open_from_memory(bytes, why_memory);
  if (!code)
    throw Error(detail::str_cat("generated kernels: loading the module: from a file: ", why_dir, "; from memory: ",
                                why_memory));
  fns.clear();
  for (size_t k = 0; k < n; ++k) {
    void* f = dlsym(code.get(), kernel_name(k).c_str());
    if (!f) throw Error(detail::str_cat("generated kernels: the module has no ", kernel_name(k)));
    fns.push_back(reinterpret_cast<FusedFn>(f));
  }
  return code;
}

std::string beside_this_library(const char* name) {
  Dl_info info{};
  std::string path = name;
  if (dladdr(reinterpret_cast<void*>(&beside_this_library), &info) && info.dli_fname) {
    const std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) path = self.substr(0, slash + 1) + name;
  }
  return path;
}

// The generator: cached code, else the compiler process's.
class ProcessGenerator final : public Generator {
 public:
  explicit ProcessGenerator(std::string program) : program_(std::move(program)) {
    static ProcessGenerator* self = this;
    pthread_atfork(nullptr, nullptr, [] { self->after_fork_in_child(); });
  }

  std::string fingerprint() const override { return code_fingerprint(); }

  void prepare() override {
    if (::access(program_.c_str(), X_OK) != 0)
      throw Error(detail::str_cat("generated kernels: the compiler ", program_, " cannot be run: ", std::strerror(errno)));
  }

  // The compiler process is killed and the socket shut (not closed: remote() still reads it),
  // so a compile in flight fails at once instead of running to its end (a large module takes
  // minutes) while the process waits to exit.
  void abort() override {
    aborted_.store(true);
    std::lock_guard<std::mutex> lock(proc_mu_);
    if (pid_ > 0) ::kill(pid_, SIGKILL);
    if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);
  }

  std::shared_ptr<void> compile(const std::vector<FusedRegion>& regions, std::vector<FusedFn>& fns) override {
    const std::string request = encode_regions(regions);
    const std::string key = key_of(request);
    std::string code = objects_.load(key);
    if (!code.empty()) {
      metrics::increment("JitObjectCacheHits", 1);
    } else {
      code = remote(request);
      objects_.store(key, code);
    }
    return load_code(code, regions.size(), fns);
  }

  std::shared_ptr<void> load_cached(const std::vector<FusedRegion>& regions, std::vector<FusedFn>& fns) override {
    const std::string code = objects_.load(key_of(encode_regions(regions)));
    if (code.empty()) return nullptr;
    metrics::increment("JitObjectCacheHits", 1);
    return load_code(code, regions.size(), fns);
  }

 private:
  // One request to the compiler process, started if it is not running.
  static std::string key_of(const std::string& request) {
    ir::Hasher h;
    h.add_string(code_fingerprint());
    h.add_string(request);
    return h.finish().to_string();
  }

  // A compiler that ended since its last answer (killed, say) is replaced once; one that
  // ends on this request is an error for this module only.
  std::string remote(const std::string& request) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string answer;
    for (int attempt = 0;; ++attempt) {
      if (aborted_.load()) throw Error("generated kernels: compiling was stopped");
      const bool fresh = sock_ < 0;
      if (fresh) start();
      if (write_frame(sock_, request) && read_frame(sock_, answer) && !answer.empty()) break;
      const std::string how = stop();
      if (aborted_.load()) throw Error("generated kernels: compiling was stopped");
      if (fresh || attempt > 0) throw Error(detail::str_cat("generated kernels: the compiler process ", how));
    }
    if (answer[0] != 'K') throw Error(answer.substr(1));
    answer.erase(0, 1);
    return answer;
  }

  void start() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw Error(detail::str_cat("generated kernels: socketpair: ", std::strerror(errno)));
    // The child's end goes to its fd 3 (dup2 clears close-on-exec there); kept off 0..3 so
    // that the dup2 is never onto itself.
    int child_end = sv[1];
    if (child_end <= 3) {
      child_end = ::fcntl(sv[1], F_DUPFD_CLOEXEC, 4);
      ::close(sv[1]);
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, child_end, 3);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char* argv[] = {const_cast<char*>(program_.c_str()), nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, program_.c_str(), &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(child_end);
    if (rc != 0) {
      ::close(sv[0]);
      throw Error(detail::str_cat("generated kernels: starting ", program_, ": ", std::strerror(rc)));
    }
    {
      std::lock_guard<std::mutex> lock(proc_mu_);
      sock_ = sv[0];
      pid_ = pid;
    }
    metrics::increment("JitCompilerStarts", 1);
    if (aborted_.load()) abort();  // an abort() that came while it started
  }

  // Closes the socket and reaps the process; says how it ended.
  std::string stop() {
    int sock;
    pid_t pid;
    {
      std::lock_guard<std::mutex> lock(proc_mu_);
      sock = std::exchange(sock_, -1);
      pid = std::exchange(pid_, -1);
    }
    if (sock >= 0) ::close(sock);
    std::string how = "closed its socket";
    if (pid > 0) {
      int status = 0;
      pid_t r;
      while ((r = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
      }
      if (r == pid && WIFSIGNALED(status)) how = "was killed by signal " + std::to_string(WTERMSIG(status));
      else if (r == pid && WIFEXITED(status)) how = "exited with status " + std::to_string(WEXITSTATUS(status));
    }
    return how;
  }

  // fork(): the child does not talk to the parent's compiler (generation is off there; see
  // jit.cpp) and must not hold its socket open; the lock may have been held by a thread the
  // child does not have.
  void after_fork_in_child() {
    new (&mu_) std::mutex();
    new (&proc_mu_) std::mutex();
    if (sock_ >= 0) ::close(sock_);
    sock_ = -1;
    pid_ = -1;
  }

  const std::string program_;
  std::mutex mu_;       // one request at a time
  std::mutex proc_mu_;  // sock_ and pid_, changed by the request's thread, read by abort()
  int sock_ = -1;
  pid_t pid_ = -1;
  std::atomic<bool> aborted_{false};
  ObjectCache objects_;
};

}  // namespace

void load_code_from_memory_only(bool on) { memory_only.store(on); }

Generator* process_generator(std::string& error) {
  const std::string program = beside_this_library("lazyrt-jitc");
  if (::access(program.c_str(), X_OK) != 0) {
    error = program + " cannot be run: " + std::strerror(errno);
    return nullptr;
  }
  static ProcessGenerator* g = new ProcessGenerator(program);  // lives until exit
  return g;
}

}  // namespace lazyrt::jit
