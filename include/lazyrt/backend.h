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

}  // namespace lazyrt
