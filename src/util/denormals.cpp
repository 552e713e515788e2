#include "util/denormals.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "lazyrt/backend.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define LAZYRT_HAS_FTZ 1
#else
#define LAZYRT_HAS_FTZ 0
#endif

namespace lazyrt {
namespace {

std::atomic<bool>& setting() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("LAZYRT_FLUSH_DENORMAL");
    return LAZYRT_HAS_FTZ && !(env && std::strcmp(env, "0") == 0);
  }()};
  return on;
}

thread_local int depth = 0;

#if LAZYRT_HAS_FTZ
constexpr unsigned kFtzDaz = 0x8000u | 0x0040u;  // MXCSR: flush to zero, denormals are zero
#endif

}  // namespace

bool set_flush_denormal(bool on) {
  if (!LAZYRT_HAS_FTZ) return false;
  setting().store(on, std::memory_order_relaxed);
  return true;
}

bool flush_denormal() { return setting().load(std::memory_order_relaxed); }

namespace util {

bool flush_denormals_enabled() { return flush_denormal(); }

FlushDenormals::FlushDenormals() {
  outermost_ = depth++ == 0;
#if LAZYRT_HAS_FTZ
  if (outermost_ && setting().load(std::memory_order_relaxed)) {
    saved_ = _mm_getcsr();
    if ((saved_ & kFtzDaz) != kFtzDaz) {
      _mm_setcsr(saved_ | kFtzDaz);
      set_ = true;
    }
  }
#endif
}

FlushDenormals::~FlushDenormals() {
  --depth;
#if LAZYRT_HAS_FTZ
  if (set_) _mm_setcsr(saved_);
#endif
}

}  // namespace util
}  // namespace lazyrt
