// A small key-value store over TCP for the rendezvous of a process group: rank 0 serves it on
// MASTER_ADDR:MASTER_PORT and every rank (rank 0 too) is a client. Gloo's contexts exchange
// their addresses through it (the gloo::rendezvous::Store interface); Debian's Gloo has only
// file and Redis stores.
//
// The wire format, each request on a client's one connection answered in order:
//   set: 'S', u32 key length, key, u32 value length, value  ->  u8 1
//   get: 'G', u32 key length, key                           ->  u8 0 (absent), or u8 1, u32
//                                                               value length, value
// Integers little-endian. A client waits for keys by asking again every millisecond until its
// deadline; the store is only used while a group is being set up, so that costs nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace lazyrt::distributed {

/// The server: listens on `port` (every interface; 0 picks a free port, see port()) and keeps
/// the keys until destroyed. One thread accepts, one serves each client.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }

 private:
  void accept_loop();
  void serve(int fd);
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<std::string, std::vector<char>> data_;
  std::vector<std::thread> threads_;
  std::vector<int> clients_;
  std::thread acceptor_;
};

/// A client. Connecting retries until `timeout` (the server may not be up yet); every wait
/// and get gives up after `timeout` with lazyrt::Error naming the keys it waited for.
class TcpStore : public gloo::rendezvous::Store {
 public:
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStore() override;
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  bool try_get(const std::string& key, std::vector<char>* value);
  std::string where_;
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

}  // namespace lazyrt::distributed
