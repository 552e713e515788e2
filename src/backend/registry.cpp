// The registry of backends: every backend by name, and the one current for the process.
#include <atomic>
#include <cstdlib>

#include "backend/backend.h"
#include "backend/cpu/jit/jit.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/lower.h"
#include "lazyrt/backend.h"
#include "util/check.h"

namespace lazyrt::backend {

namespace {

// LAZYRT_FUSE_REDUCTIONS=0 (or off), read once: the cpu backend fuses no reductions (to compare
// with, or to rule fused reductions out); its fingerprint tells the two apart.
bool fuse_reductions_setting() {
  const char* env = std::getenv("LAZYRT_FUSE_REDUCTIONS");
  const std::string_view v = env ? env : "";
  return v != "0" && v != "off";
}

const std::vector<const Backend*>& registry() {
  static const auto* all = new std::vector<const Backend*>{
      cpu::make_backend("cpu", {kernels::kMaxFusedOps, kernels::kMaxFusedInputs, true, true, fuse_reductions_setting()}),
      cpu::make_backend("reference", {0, 0, false, false, false}),
  };
  return *all;
}

std::string known() {
  std::string s;
  for (const Backend* b : registry()) s += (s.empty() ? "" : ", ") + b->name();
  return s;
}

std::atomic<const Backend*>& chosen() {
  static std::atomic<const Backend*> b{nullptr};
  return b;
}

}  // namespace

const Backend& get(std::string_view name) {
  for (const Backend* b : registry())
    if (b->name() == name) return *b;
  throw Error(detail::str_cat("unknown backend '", name, "' (known: ", known(), ")"));
}

const Backend& current() {
  if (const Backend* b = chosen().load(std::memory_order_acquire)) return *b;
  const char* env = std::getenv("LAZYRT_BACKEND");
  const Backend* b = nullptr;
  try {
    b = &get(env && *env ? env : "cpu");
  } catch (const Error& e) {
    throw Error(detail::str_cat("LAZYRT_BACKEND: ", e.what()));
  }
  const Backend* expected = nullptr;
  chosen().compare_exchange_strong(expected, b, std::memory_order_acq_rel);
  return *chosen().load(std::memory_order_acquire);
}

void set_current(std::string_view name) { chosen().store(&get(name), std::memory_order_release); }

std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const Backend* b : registry()) out.push_back(b->name());
  return out;
}

}  // namespace lazyrt::backend

namespace lazyrt {

void set_backend(const std::string& name) { backend::set_current(name); }
std::string current_backend() { return backend::current().name(); }
std::vector<std::string> available_backends() { return backend::names(); }
void wait_for_generated_code() { jit::wait_idle(); }
void stop_generating_code() { jit::shutdown(); }

}  // namespace lazyrt
