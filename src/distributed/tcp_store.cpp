#include "distributed/tcp_store.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/check.h"

namespace lazyrt::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// Whole reads and writes; false when the peer closed the connection or the socket failed.
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool write_u32(int fd, uint32_t v) {
  unsigned char b[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                        static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 24)};
  return write_all(fd, b, 4);
}
bool read_u32(int fd, uint32_t* v) {
  unsigned char b[4];
  if (!read_all(fd, b, 4)) return false;
  *v = b[0] | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
  return true;
}
// Keys and values of a rendezvous are small; a longer one is a corrupt stream.
constexpr uint32_t kMaxItem = 1u << 24;
bool read_item(int fd, std::string* s) {
  uint32_t n = 0;
  if (!read_u32(fd, &n) || n > kMaxItem) return false;
  s->resize(n);
  return read_all(fd, s->data(), n);
}

}  // namespace

// ---- server ---------------------------------------------------------------------------------

TcpStoreServer::TcpStoreServer(int port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  LAZYRT_CHECK(listen_fd_ >= 0, "init_process_group: cannot create the store's socket: ", std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 128) != 0) {
    const int e = errno;
    ::close(listen_fd_);
    throw Error(detail::str_cat("init_process_group: rank 0 cannot serve the rendezvous store on port ", port, ": ",
                                std::strerror(e), " (is MASTER_PORT in use by another job?)"));
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  acceptor_.join();
  ::close(listen_fd_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : threads_) t.join();
  for (int fd : clients_) ::close(fd);
}

void TcpStoreServer::accept_loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(mu_);
    clients_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::serve(int fd) {
  for (;;) {
    char cmd = 0;
    std::string key;
    if (!read_all(fd, &cmd, 1) || !read_item(fd, &key)) return;
    if (cmd == 'S') {
      std::string value;
      if (!read_item(fd, &value)) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = std::vector<char>(value.begin(), value.end());
      }
      const char ok = 1;
      if (!write_all(fd, &ok, 1)) return;
    } else if (cmd == 'G') {
      std::vector<char> value;
      char found = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = data_.find(key);
        if (it != data_.end()) {
          found = 1;
          value = it->second;
        }
      }
      if (!write_all(fd, &found, 1)) return;
      if (found && (!write_u32(fd, static_cast<uint32_t>(value.size())) || !write_all(fd, value.data(), value.size())))
        return;
    } else {
      return;  // not a client of ours
    }
  }
}

// ---- client ---------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : where_(detail::str_cat(host, ":", port)), timeout_(timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      last_error = ::gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline)
      throw Error(detail::str_cat("init_process_group: cannot reach the rendezvous store at ", where_,
                                  " (MASTER_ADDR:MASTER_PORT, served by rank 0) within ",
                                  timeout.count(), " ms: ", last_error));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A store that stops answering (rank 0 gone) fails a request instead of blocking it.
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  std::lock_guard<std::mutex> lock(mu_);
  const char cmd = 'S';
  char ok = 0;
  const bool sent = write_all(fd_, &cmd, 1) && write_u32(fd_, static_cast<uint32_t>(key.size())) &&
                    write_all(fd_, key.data(), key.size()) && write_u32(fd_, static_cast<uint32_t>(data.size())) &&
                    write_all(fd_, data.data(), data.size());
  LAZYRT_CHECK(sent && read_all(fd_, &ok, 1) && ok == 1, "process group store at ", where_,
               ": setting '", key, "' failed (the store on rank 0 is gone)");
}

bool TcpStore::try_get(const std::string& key, std::vector<char>* value) {
  std::lock_guard<std::mutex> lock(mu_);
  const char cmd = 'G';
  char found = 0;
  const bool asked = write_all(fd_, &cmd, 1) && write_u32(fd_, static_cast<uint32_t>(key.size())) &&
                     write_all(fd_, key.data(), key.size()) && read_all(fd_, &found, 1);
  LAZYRT_CHECK(asked, "process group store at ", where_, ": reading '", key, "' failed (the store on rank 0 is gone)");
  if (!found) return false;
  uint32_t n = 0;
  LAZYRT_CHECK(read_u32(fd_, &n) && n <= kMaxItem, "process group store at ", where_, ": bad answer for '", key, "'");
  value->resize(n);
  LAZYRT_CHECK(read_all(fd_, value->data(), n), "process group store at ", where_, ": bad answer for '", key, "'");
  return true;
}

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<char> ignored;
  for (const std::string& key : keys) {
    while (!try_get(key, &ignored)) {
      if (Clock::now() >= deadline)
        throw Error(detail::str_cat("process group store at ", where_, ": timed out after ", timeout.count(),
                                    " ms waiting for '", key, "' (a rank did not join or died)"));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::vector<char> value;
  try_get(key, &value);
  return value;
}

}  // namespace lazyrt::distributed
