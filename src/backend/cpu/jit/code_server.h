// The compiler process: generated kernels are compiled outside the process that runs them.
//
// LLVM is a large library: loading libLLVM-16.so alone makes ~44 MB of a process resident
// (its relocations, symbol tables and 600 static constructors), and compiling a module touches
// more. So the process that runs the kernels never loads it. The first module to compile
// starts lazyrt-jitc (jitc_main.cpp, beside liblazyrt.so), one per process, which reads
// modules from a socket, compiles each with LLVM (codegen.cpp) into a relocatable object,
// links that with the system linker into a shared object, and sends its bytes back. The
// running process writes them to a private directory, loads them with dlopen and unlinks the
// file (where no directory allows executable mappings, from a memory file: memfd_create);
// dlclose frees the code with its graph. The persistent cache stores the shared object
// (object_cache.h), so a warm process loads code without starting the compiler at all.
//
// Wire format on the socket (integers little-endian): a frame is u64 n, then n bytes. A request
// is one frame: u32 #regions, then per region u64 len + serialize_graph(region), u32 #strides,
// i64 stride*. The answer is one frame: 'K' + the shared object's bytes, or 'E' + a message.
// The compiler exits when the socket closes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/jit/jit.h"

namespace lazyrt::jit {

/// Raised when generated code changes what it computes, so that code cached on disk by another
/// version is never loaded.
inline constexpr int kGeneratorVersion = 5;

/// The request for a module's regions, and back.
std::string encode_regions(const std::vector<FusedRegion>& regions);
std::vector<FusedRegion> decode_regions(std::string_view bytes);

/// One frame on a blocking socket or pipe; false when the peer is gone (or the read is short).
bool write_frame(int fd, std::string_view bytes);
bool read_frame(int fd, std::string& bytes);

/// Writes all of bytes to a file descriptor (retrying short writes); false on an error.
bool write_all(int fd, std::string_view bytes);

/// The name of region k's loop in a module.
std::string kernel_name(size_t k);

/// The generator of this process (jit.h): code from the persistent cache, else from the
/// compiler process; null, with error set, where lazyrt-jitc is missing.
Generator* process_generator(std::string& error);

/// Loads code from memory files only, as where no directory allows executable mappings.
void load_code_from_memory_only(bool on);

/// What generated code depends on besides its regions: the generator's version, LLVM's, and
/// this CPU (its vendor, family, model, stepping and every feature flag cpuid reports, with
/// the register state the OS enables). Code made for another CPU is never loaded.
const std::string& code_fingerprint();

}  // namespace lazyrt::jit
