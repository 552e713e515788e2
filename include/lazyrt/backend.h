// The backend graphs are compiled for and run on, one per process: "cpu" (the default: CPU
// kernels with elementwise fusion) or "reference" (the same kernels one op at a time, no fusion
// and no rewriting of products: the oracle that tests compare other backends with). The
// environment variable LAZYRT_BACKEND chooses it at start; set_backend() changes it. The backend
// is part of every cache key, so executables of one never run for another; compiled steps and
// warmed-up graphs keep the backend they were made for.
#pragma once

#include <string>
#include <vector>

namespace lazyrt {

/// Makes `name` the backend of every graph compiled from now on; throws lazyrt::Error for an
/// unknown name, naming the known ones.
void set_backend(const std::string& name);
std::string current_backend();
std::vector<std::string> available_backends();

/// Whether lazyrt's kernels treat floats too small for a normal exponent (denormals) as zero,
/// read and written (x86's FTZ and DAZ modes, set on each thread only while it runs lazyrt's
/// kernels), as XLA's CPU backend does and torch.set_flush_denormal(True) asks of PyTorch:
/// arithmetic on denormals is 10 to 100 times slower, and a long loop's decaying gradients reach
/// them. On by default (LAZYRT_FLUSH_DENORMAL=0 turns it off at start). Returns false, changing
/// nothing, where the CPU has no such mode; oneDNN's convolutions keep their own mode.
bool set_flush_denormal(bool on);
bool flush_denormal();

/// The cpu backend compiles hot fusion regions and loops to machine code on a compiler thread
/// (in a process of its own) while the interpreter runs them. Waits until everything handed to
/// it so far is compiled.
void wait_for_generated_code();
/// Generation off for the rest of the process; ends the compile in flight (its code stays
/// interpreted).
void stop_generating_code();

}  // namespace lazyrt
