// A lock for sections of a few instructions taken on every traced op (the registry of pending
// tensors): taking and releasing it is one atomic exchange and one store, where a mutex costs
// a library call each way. A waiter spins briefly, then yields its time slice. BasicLockable,
// for std::lock_guard.
#pragma once

#include <atomic>
#include <thread>

namespace lazyrt::util {

class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire);) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 64) pause();
        else std::this_thread::yield();
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  std::atomic<bool> locked_{false};
};

}  // namespace lazyrt::util
