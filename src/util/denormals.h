// Floats too small for a normal exponent (denormals) make x86 arithmetic 10 to 100 times
// slower; the decaying gradients of a long loop reach them (a loop gradient over 2,000 Euler
// steps ran 12x slower in PyTorch eager than with them flushed). lazyrt's kernels treat them as
// zero, read and written (the CPU's FTZ and DAZ modes), as XLA's CPU backend does and as
// torch.set_flush_denormal(True) asks of PyTorch's. The mode is set on each thread while it
// runs lazyrt's kernels and put back after, so other code on those threads (the caller's,
// PyTorch's OpenMP work) keeps its own.
#pragma once

namespace lazyrt::util {

/// The process-wide setting (lazyrt::set_flush_denormal).
bool flush_denormals_enabled();

/// While alive, this thread runs with denormals flushed when the setting is on; then its
/// floating-point mode is as before. Nested scopes cost a thread-local check.
class FlushDenormals {
 public:
  FlushDenormals();
  ~FlushDenormals();
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_ = 0;
  bool outermost_ = false, set_ = false;
};

}  // namespace lazyrt::util
