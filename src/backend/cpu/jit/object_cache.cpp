#include "backend/cpu/jit/object_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "ir/hash.h"
#include "cache/persistent_cache.h"
#include "backend/cpu/jit/code_server.h"
#include "lazyrt/cache.h"
#include "util/metrics_cells.h"

namespace lazyrt::jit {
namespace {

constexpr char kMagic[8] = {'L', 'Z', 'R', 'T', 'C', 'O', 'D', '2'};
constexpr size_t kHeaderBytes = 8 + 8 + 16;  // magic, u64 size, checksum hi and lo

GraphHash checksum(const char* data, size_t n) {
  ir::Hasher h;
  h.add_bytes(data, n);
  return h.finish();
}

// Why `path` may not hold code this process runs, or "" when it may.
std::string untrusted_dir(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return std::string("cannot be read (") + std::strerror(errno) + ")";
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  if (st.st_uid != geteuid()) return "is owned by another user";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return "is writable by group or others";
  return "";
}

// The folder of objects, checked at every use (a module is compiled rarely; permissions may
// change); "" when there is none or it is refused.
std::string objects_dir(bool for_writing) {
  const std::string dir = cache::persistent_dir();
  if (dir.empty()) return "";
  const std::string jit = dir + "/jit";
  if (for_writing && !cache::persistent_readonly()) ::mkdir(jit.c_str(), 0700);
  std::string which = dir, why = untrusted_dir(dir);
  if (why.empty()) {
    struct stat st {};
    if (lstat(jit.c_str(), &st) != 0 && errno == ENOENT) return "";  // nothing stored yet
    which = jit;
    why = untrusted_dir(jit);
  }
  if (why.empty()) return jit;
  metrics::increment("JitObjectCacheRefused", 1);
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(which).second)
    std::fprintf(stderr, "lazyrt: generated code is neither loaded from nor stored in %s: it %s; modules are compiled instead\n",
                 which.c_str(), why.c_str());
  return "";
}

}  // namespace

std::string ObjectCache::load(const std::string& key) {
  const std::string dir = objects_dir(false);
  if (dir.empty()) return "";
  const std::string path = dir + "/" + key + ".so";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string bytes;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & (S_IWGRP | S_IWOTH)) &&
      st.st_size >= static_cast<off_t>(kHeaderBytes) && st.st_size < (off_t{1} << 30)) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    if (got != bytes.size()) bytes.clear();
  }
  ::close(fd);
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0) return "";
  uint64_t size, hi, lo;
  std::memcpy(&size, bytes.data() + 8, 8);
  std::memcpy(&hi, bytes.data() + 16, 8);
  std::memcpy(&lo, bytes.data() + 24, 8);
  if (size == 0 || size != bytes.size() - kHeaderBytes) return "";
  const GraphHash sum = checksum(bytes.data() + kHeaderBytes, size);
  if (sum.hi != hi || sum.lo != lo) return "";
  return bytes.substr(kHeaderBytes);
}

void ObjectCache::store(const std::string& key, const std::string& code) {
  if (cache::persistent_readonly()) return;
  const std::string dir = objects_dir(true);
  if (dir.empty()) return;
  std::string file(kMagic, 8);
  const uint64_t size = code.size();
  const GraphHash sum = checksum(code.data(), size);
  file.append(reinterpret_cast<const char*>(&size), 8);
  file.append(reinterpret_cast<const char*>(&sum.hi), 8);
  file.append(reinterpret_cast<const char*>(&sum.lo), 8);
  file += code;
  const std::string tmp = dir + "/." + key + "." + cache::unique_suffix() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const bool written = write_all(fd, file);
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), (dir + "/" + key + ".so").c_str()) != 0) ::unlink(tmp.c_str());
  else metrics::increment("JitObjectCacheStores", 1);
}

}  // namespace lazyrt::jit
