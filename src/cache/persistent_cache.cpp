#include "cache/persistent_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>

#include "ir/hash.h"
#include "ir/serialize.h"
#include "lazyrt/cache.h"
#include "util/bytes.h"
#include "util/check.h"

#ifndef LAZYRT_VERSION_STRING
#error "the build defines LAZYRT_VERSION_STRING (the project version)"
#endif

namespace lazyrt::cache {
namespace {

using detail::ByteReader;
using detail::ByteWriter;
using detail::str_cat;
namespace fmt = entry_format;

// Temporary files older than this are leftovers of a writer that died between creating and
// renaming them; eviction deletes them.
constexpr auto kStaleTemporaryAge = std::chrono::hours(1);
constexpr std::string_view kTemporarySuffix = ".tmp";

void warn(const std::string& message) { std::fprintf(stderr, "lazyrt: %s\n", message.c_str()); }

std::string errno_text(int err) { return std::strerror(err); }

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Says `message` once per process: a cache that cannot write keeps failing on every compile.
void warn_once(const std::string& message) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) warn(message + " (said once; later failures are silent)");
}

std::string padded_library_version() {
  std::string version(library_version());
  LAZYRT_ASSERT(version.size() < fmt::kLibraryVersionBytes, "version ", version, " is too long");
  version.resize(fmt::kLibraryVersionBytes, '\0');
  return version;
}

GraphHash checksum(std::string_view body) {
  ir::Hasher h;
  h.add_bytes(body.data(), body.size());
  return h.finish();
}

std::string header_for(const GraphHash& key, std::string_view body) {
  ByteWriter w;
  w.bytes(std::string_view(fmt::kMagic, sizeof fmt::kMagic));
  w.u32(fmt::kVersion);
  w.u32(ir::kIrFormatVersion);
  w.bytes(padded_library_version());
  w.u64(cpu_fingerprint());
  w.u64(key.hi);
  w.u64(key.lo);
  w.u64(body.size());
  const GraphHash sum = checksum(body);
  w.u64(sum.hi);
  w.u64(sum.lo);
  LAZYRT_ASSERT(w.str().size() == fmt::kHeaderBytes, "entry header is ", w.str().size(), " bytes");
  return w.take();
}

constexpr size_t kKeyDigits = 32, kTagDigits = 8;

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// An entry of any build: eviction weighs them all.
bool is_entry_name(std::string_view name) {
  return name.size() == kKeyDigits + 1 + kTagDigits + kEntrySuffix.size() &&
         is_hex(name.substr(0, kKeyDigits)) && name[kKeyDigits] == '-' &&
         is_hex(name.substr(kKeyDigits + 1, kTagDigits)) &&
         name.substr(kKeyDigits + 1 + kTagDigits) == kEntrySuffix;
}

// What distinguishes this build's entries from another's: the header fields it checks.
std::string build_tag() {
  ir::Hasher h;
  h.add(fmt::kVersion);
  h.add(ir::kIrFormatVersion);
  h.add_string(library_version());
  h.add(cpu_fingerprint());
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(h.finish().lo & 0xFFFFFFFFu));
  return buf;
}

bool is_temporary_name(std::string_view name) {
  return name.size() > kTemporarySuffix.size() && name[0] == '.' &&
         name.substr(name.size() - kTemporarySuffix.size()) == kTemporarySuffix;
}

std::chrono::nanoseconds mtime_of(const struct stat& st) {
  return std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
}

// A name no other writer in any process or host picks.
std::string temporary_name(const GraphHash& key) {
  return str_cat(".", key.to_string(), ".", unique_suffix(), kTemporarySuffix);
}

bool write_all(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// mkdir -p; true when the directory exists afterwards.
bool make_directories(const std::string& dir) {
  for (size_t at = 1; at <= dir.size(); ++at) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string prefix = dir.substr(0, at);
    struct stat st;
    // An existing parent may still refuse mkdir (EACCES, EROFS) rather than say EEXIST.
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST &&
        !(::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
      return false;
  }
  struct stat st;
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Reads a whole regular file of at most kMaxEntryBytes. Opening never blocks (a FIFO planted
// under an entry's name would otherwise hang the reader).
enum class ReadResult { Ok, Missing, Failed };
ReadResult read_entry_file(const std::string& path, std::string* bytes, std::string* error) {
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) break;
    const int err = errno;
    if (err != ENOENT && err != ENOTDIR) {  // ENOTDIR: there is no cache directory
      *error = "cannot open it: " + errno_text(err);
      return ReadResult::Failed;
    }
    // Nothing there, a dangling link, or an entry another process renamed into place just
    // after the open: look again once.
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || attempt == 1) return ReadResult::Missing;
    if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0) {
      *error = "it is a dangling symbolic link";
      return ReadResult::Failed;
    }
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    *error = "cannot stat it: " + errno_text(errno);
    return ReadResult::Failed;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = "it is not a regular file";
    return ReadResult::Failed;
  }
  if (static_cast<uint64_t>(st.st_size) > fmt::kMaxEntryBytes) {
    *error = str_cat("it is ", st.st_size, " bytes, more than any entry (", fmt::kMaxEntryBytes, ")");
    return ReadResult::Failed;
  }
  bytes->resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes->size()) {
    ssize_t n = ::read(fd, bytes->data() + done, bytes->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = "cannot read it: " + errno_text(errno);
      return ReadResult::Failed;
    }
    if (n == 0) break;  // shorter than fstat said: the checks below reject it
    done += static_cast<size_t>(n);
  }
  bytes->resize(done);
  return ReadResult::Ok;
}

std::vector<ir::TensorType> param_types(const ir::Graph& g, std::vector<bool>* present) {
  std::vector<ir::TensorType> types(static_cast<size_t>(std::max<int64_t>(g.num_params, 0)));
  present->assign(types.size(), false);
  for (const ir::Node& n : g.nodes)
    if (n.op == ir::OpKind::Parameter) {
      const auto i = static_cast<size_t>(ir::NodeAttrs(n.op, n.attrs).i<"index">());
      types[i] = n.results[0];
      (*present)[i] = true;
    }
  return types;
}

}  // namespace

std::string_view library_version() { return LAZYRT_VERSION_STRING; }

uint64_t cpu_fingerprint() {
  static const uint64_t fingerprint = [] {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  uint64_t f = 1;  // x86
  int bit = 8;
  auto feature = [&](bool has) { f |= static_cast<uint64_t>(has) << bit++; };
  feature(__builtin_cpu_is("intel"));
  feature(__builtin_cpu_is("amd"));
  feature(__builtin_cpu_supports("sse4.2"));
  feature(__builtin_cpu_supports("avx"));
  feature(__builtin_cpu_supports("avx2"));
  feature(__builtin_cpu_supports("fma"));
  feature(__builtin_cpu_supports("bmi2"));
  feature(__builtin_cpu_supports("avx512f"));
  feature(__builtin_cpu_supports("avx512bw"));
  feature(__builtin_cpu_supports("avx512vl"));
  feature(__builtin_cpu_supports("avx512vnni"));
  return f;
#elif defined(__aarch64__)
  return uint64_t{2};
#else
  return uint64_t{3};
#endif
  }();
  return fingerprint;
}

std::string encode_entry_body(const CacheEntry& entry) {
  const std::string graph = ir::serialize_graph(entry.graph);
  ByteWriter w;
  w.u32(static_cast<uint32_t>(entry.donations.size()));
  for (int32_t d : entry.donations) w.i32(d);
  w.u64(graph.size());
  w.bytes(graph);
  return w.take();
}

std::string seal_entry(const GraphHash& key, std::string_view body) {
  std::string file = header_for(key, body);
  file.append(body);
  return file;
}

CacheEntry decode_entry(std::string_view file) {
  ByteReader header(file, "cache entry header");
  if (file.size() < fmt::kHeaderBytes)
    header.fail(str_cat("the file has ", file.size(), " bytes, a header alone ", fmt::kHeaderBytes));
  if (header.bytes(sizeof fmt::kMagic) != std::string_view(fmt::kMagic, sizeof fmt::kMagic))
    header.fail("wrong magic: not a lazyrt cache entry");
  if (const uint32_t v = header.u32(); v != fmt::kVersion)
    header.fail(str_cat("entry format ", v, ", this build reads ", fmt::kVersion));
  if (const uint32_t v = header.u32(); v != ir::kIrFormatVersion)
    header.fail(str_cat("IR format ", v, ", this build uses ", ir::kIrFormatVersion));
  // Compared in full, padding included: every header byte is checked.
  const std::string_view version = header.bytes(fmt::kLibraryVersionBytes);
  if (version != padded_library_version())
    header.fail(str_cat("written by lazyrt ", version.substr(0, version.find('\0')), ", this is ",
                        library_version()));
  if (const uint64_t cpu = header.u64(); cpu != cpu_fingerprint())
    header.fail(str_cat("written for CPU fingerprint ", hex(cpu), ", this machine has ",
                        hex(cpu_fingerprint())));
  CacheEntry entry;
  entry.key.hi = header.u64();
  entry.key.lo = header.u64();
  const uint64_t body_size = header.u64();
  GraphHash sum;
  sum.hi = header.u64();
  sum.lo = header.u64();
  const std::string_view body = file.substr(fmt::kHeaderBytes);
  if (body_size != body.size())
    header.fail(str_cat("the body should have ", body_size, " bytes, the file holds ", body.size()));
  if (checksum(body) != sum) header.fail("checksum mismatch: the body is corrupt");

  ByteReader r(body, "cache entry body");
  entry.donations.resize(r.count(4, "donations"));
  for (int32_t& d : entry.donations) d = r.i32();
  const uint64_t graph_size = r.u64();
  if (graph_size != r.remaining())
    r.fail(str_cat("the graph should have ", graph_size, " bytes, ", r.remaining(), " are left"));
  entry.graph = ir::deserialize_graph(r.bytes(r.remaining()));
  for (int32_t d : entry.donations)
    if (d < -1 || d >= entry.graph.num_params)
      r.fail(str_cat("donation of parameter ", d, " in a graph of ", entry.graph.num_params));
  return entry;
}

std::string interface_mismatch(const ir::Graph& traced, const ir::Graph& loaded) {
  if (traced.num_params != loaded.num_params)
    return str_cat("it takes ", loaded.num_params, " parameters, the traced graph ", traced.num_params);
  std::vector<bool> traced_has, loaded_has;
  const auto want = param_types(traced, &traced_has);
  const auto got = param_types(loaded, &loaded_has);
  for (size_t i = 0; i < got.size(); ++i)
    if (loaded_has[i] && (!traced_has[i] || got[i] != want[i]))
      return str_cat("its parameter ", i, " is ", ir::type_str(got[i]),
                     traced_has[i] ? ", the traced one " + ir::type_str(want[i]) : ", unused when traced");
  if (traced.outputs.size() != loaded.outputs.size())
    return str_cat("it returns ", loaded.outputs.size(), " values, the traced graph ",
                   traced.outputs.size());
  for (size_t k = 0; k < traced.outputs.size(); ++k)
    if (traced.type(traced.outputs[k]) != loaded.type(loaded.outputs[k]))
      return str_cat("its output ", k, " is ", ir::type_str(loaded.type(loaded.outputs[k])),
                     ", the traced one ", ir::type_str(traced.type(traced.outputs[k])));
  return {};
}

PersistentCache::PersistentCache(std::string dir, bool readonly, uint64_t max_bytes)
    : dir_(std::move(dir)), readonly_(readonly), max_bytes_(max_bytes) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
}

std::string unique_suffix() {
  static std::mutex mu;
  static std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), static_cast<unsigned>(getpid())};
    return std::mt19937_64(seq);
  }();
  uint64_t bits;
  {
    std::lock_guard<std::mutex> lock(mu);
    bits = rng();
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
  return str_cat(getpid(), ".", buf);
}

std::string entry_file_name(const GraphHash& key) {
  static const std::string tag = build_tag();
  return str_cat(key.to_string(), "-", tag, kEntrySuffix);
}

std::string PersistentCache::path_of(const GraphHash& key) const {
  return str_cat(dir_, "/", entry_file_name(key));
}

PersistentCache::Lookup PersistentCache::load(const GraphHash& key, const ir::Graph& traced,
                                              const std::vector<int32_t>& donations) const {
  Lookup out;
  const std::string path = path_of(key);
  std::string bytes;
  switch (read_entry_file(path, &bytes, &out.error)) {
    case ReadResult::Missing: out.status = Status::Miss; return out;
    case ReadResult::Failed: out.status = Status::Bad; return out;
    case ReadResult::Ok: break;
  }
  out.status = Status::Bad;
  try {
    out.entry = decode_entry(bytes);
  } catch (const std::exception& e) {  // lazyrt::Error, or bad_alloc on a hostile size
    out.error = e.what();
    return out;
  }
  if (out.entry.key != key) {
    out.error = str_cat("it holds the entry of graph ", out.entry.key.to_string(),
                        " (a renamed or copied file)");
    return out;
  }
  if (out.entry.donations != donations) {
    out.error = "it was compiled with other donations than this sync makes";
    return out;
  }
  if (std::string why = interface_mismatch(traced, out.entry.graph); !why.empty()) {
    out.error = "it does not fit the traced graph: " + why;
    return out;
  }
  out.status = Status::Hit;
  // Least recently used is judged by mtime. A failure (someone else's file) only makes the
  // entry look older than it is.
  if (!readonly_) ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  return out;
}

bool PersistentCache::store(const CacheEntry& entry, std::string* error) const {
  std::string ignored;
  std::string& why = error ? *error : ignored;
  if (readonly_) {
    why = "the cache is read-only";
    return false;
  }
  if (!write_entry(entry, &why)) {
    warn_once(str_cat("persistent cache: not stored: ", why));
    return false;
  }
  if (max_bytes_ > 0) evict();
  return true;
}

bool PersistentCache::write_entry(const CacheEntry& entry, std::string* error) const {
  std::string& why = *error;
  std::string file;
  try {
    file = encode_entry(entry);
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
  const std::string temp = str_cat(dir_, "/", temporary_name(entry.key));
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0 && errno == ENOENT && make_directories(dir_))
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    why = str_cat("cannot create ", temp, ": ", errno_text(errno));
    return false;
  }
  // No fsync before the rename: after a power loss the renamed file may be incomplete, and
  // the full check on load turns that into one DeserializeFailure and a rewrite. Durability
  // would cost a sync per compiled graph (milliseconds, several times the compile itself) in
  // every process that meets a new graph, to save one recompile after a crash.
  const bool written = write_all(fd, file);
  const int write_errno = errno;
  if (::close(fd) != 0 || !written) {
    why = str_cat("cannot write ", temp, ": ", errno_text(written ? errno : write_errno));
    ::unlink(temp.c_str());
    return false;
  }
  const std::string path = path_of(entry.key);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    // Something that is not a file sits at the entry's path (an empty directory, say):
    // remove it if it can be removed without recursing, and try once more.
    const int err = errno;
    if (std::remove(path.c_str()) != 0 || ::rename(temp.c_str(), path.c_str()) != 0) {
      why = str_cat("cannot rename ", temp, " to ", path, ": ", errno_text(err));
      ::unlink(temp.c_str());
      return false;
    }
  }
  return true;
}

void PersistentCache::evict() const {
  if (readonly_) return;
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return;
  struct Item {
    std::chrono::nanoseconds mtime;
    std::string name;
    uint64_t bytes;
  };
  std::vector<Item> entries;
  std::vector<std::string> stale;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    const bool entry = is_entry_name(name);
    if (!entry && !is_temporary_name(name)) continue;
    const std::string path = str_cat(dir_, "/", name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // gone, or not ours
    if (entry)
      entries.push_back({mtime_of(st), std::string(name), static_cast<uint64_t>(st.st_size)});
    else if (now - mtime_of(st) > kStaleTemporaryAge)
      stale.push_back(path);
  }
  ::closedir(d);
  for (const std::string& path : stale) ::unlink(path.c_str());
  uint64_t total = 0;
  for (const Item& it : entries) total += it.bytes;
  if (total <= max_bytes_) return;
  std::sort(entries.begin(), entries.end(), [](const Item& a, const Item& b) {
    return a.mtime != b.mtime ? a.mtime < b.mtime : a.name < b.name;
  });
  for (const Item& it : entries) {
    if (total <= max_bytes_) break;
    // Whether we removed it or another process did first, it no longer counts.
    ::unlink(str_cat(dir_, "/", it.name).c_str());
    total -= it.bytes;
  }
}

void PersistentCache::warn_bad_entry(const GraphHash& key, const std::string& why) const {
  static std::mutex mu;
  static std::set<std::string>* warned = new std::set<std::string>();
  const std::string path = path_of(key);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned->insert(path).second) return;
  }
  warn(str_cat("persistent cache: ignoring ", path, ": ", why,
               readonly_ ? " (read-only cache: left as it is)" : " (it will be replaced)"));
}

// ---- process-wide configuration --------------------------------------------------------

namespace {

struct Settings {
  std::mutex mu;
  std::string dir;
  bool readonly = false;
  uint64_t max_bytes = 0;
  std::shared_ptr<const PersistentCache> cache;  // rebuilt on every change
};

bool parse_bool(const char* name, std::string value) {
  for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value.empty() || value == "0" || value == "false" || value == "no" || value == "off")
    return false;
  warn(str_cat(name, "=", value, " is not one of 1/0, true/false, yes/no, on/off; ",
               "treating the cache as read-only"));
  return true;
}

// Bytes, with an optional binary suffix K, M, G or T ("512M").
bool parse_bytes(std::string_view value, uint64_t* out) {
  uint64_t n = 0;
  size_t i = 0;
  for (; i < value.size() && value[i] >= '0' && value[i] <= '9'; ++i)
    if (__builtin_mul_overflow(n, 10, &n) || __builtin_add_overflow(n, value[i] - '0', &n))
      return false;
  if (i == 0) return false;
  int shift = 0;
  if (i + 1 == value.size()) {
    switch (std::toupper(static_cast<unsigned char>(value[i]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: return false;
    }
  } else if (i != value.size()) {
    return false;
  }
  if (shift && n > (UINT64_MAX >> shift)) return false;
  *out = n << shift;
  return true;
}

void rebuild_locked(Settings& s) {
  s.cache = s.dir.empty() ? nullptr
                          : std::make_shared<const PersistentCache>(s.dir, s.readonly, s.max_bytes);
  if (s.cache && !s.readonly && !make_directories(s.cache->dir()))
    warn(str_cat("persistent cache: cannot create the directory ", s.cache->dir(), ": ",
                 errno_text(errno), "; entries will not be written"));
}

// The settings, read from the environment at first use.
Settings& settings() {
  static Settings* s = [] {
    auto* s = new Settings();  // never destroyed: usable from static destructors
    if (const char* dir = std::getenv("LAZYRT_CACHE_DIR")) s->dir = dir;
    if (const char* ro = std::getenv("LAZYRT_CACHE_READONLY"))
      s->readonly = parse_bool("LAZYRT_CACHE_READONLY", ro);
    if (const char* max = std::getenv("LAZYRT_CACHE_MAX_BYTES"); max && *max) {
      if (!parse_bytes(max, &s->max_bytes)) {
        warn(str_cat("LAZYRT_CACHE_MAX_BYTES=", max, " is not a byte count (like 1073741824 ",
                     "or 1G); the persistent cache has no size cap"));
        s->max_bytes = 0;
      }
    }
    rebuild_locked(*s);
    return s;
  }();
  return *s;
}

}  // namespace

std::shared_ptr<const PersistentCache> persistent_cache() {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.cache;
}

void set_persistent_dir(const std::string& dir, bool readonly) {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  s.dir = dir;
  s.readonly = readonly;
  rebuild_locked(s);
}

std::string persistent_dir() {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.dir;
}

bool persistent_readonly() {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.readonly;
}

void set_persistent_max_bytes(uint64_t bytes) {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  s.max_bytes = bytes;
  rebuild_locked(s);
}

uint64_t persistent_max_bytes() {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.max_bytes;
}

}  // namespace lazyrt::cache
