#include "backend/backend.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/lower.h"
#include "lazyrt/backend.h"
#include "ir/hash.h"
#include "backend/cpu/kernels/ops.h"
#include "util/check.h"

namespace lazyrt::backend {

std::shared_ptr<runtime::Buffer> Backend::allocate(size_t bytes) const { return runtime::allocate(bytes); }

std::shared_ptr<runtime::Buffer> Backend::copy(const runtime::Buffer& b) const {
  return from_host(b.data(), b.bytes());
}

std::shared_ptr<runtime::Buffer> Backend::from_host(const void* data, size_t bytes) const {
  auto b = allocate(bytes);
  if (bytes) std::memcpy(b->data(), data, bytes);
  return b;
}

std::shared_ptr<const void> Backend::to_host(const std::shared_ptr<runtime::Buffer>& b) const {
  return std::shared_ptr<const void>(b, b->data());
}

namespace {

// The CPU kernels; `caps` decides how much of the graph they see fused.
class CpuBackend final : public Backend {
 public:
  CpuBackend(std::string name, Capabilities caps) : name_(std::move(name)), caps_(caps) {
    ir::Hasher h;
    h.add_string(name_);
    h.add(static_cast<uint64_t>(caps_.max_fused_ops));
    h.add(static_cast<uint64_t>(caps_.max_fused_inputs));
    h.add(static_cast<uint64_t>(caps_.gemm));
    h.add(static_cast<uint64_t>(caps_.library_kernels));
    h.add(static_cast<uint64_t>(caps_.fuses_reductions));
    fingerprint_ = h.finish().lo;
  }
  const std::string& name() const override { return name_; }
  uint64_t fingerprint() const override { return fingerprint_; }
  const Capabilities& capabilities() const override { return caps_; }
  std::shared_ptr<runtime::Executable> lower(const ir::Graph& optimized,
                                             const std::vector<int32_t>& donations) const override {
    return cpu::lower(optimized, donations, *this);
  }

 private:
  std::string name_;
  Capabilities caps_;
  uint64_t fingerprint_ = 0;
};

// LAZYRT_FUSE_REDUCTIONS=0 (or off), read once: the cpu backend fuses no reductions (to compare
// with, or to rule fused reductions out); its fingerprint tells the two apart.
bool fuse_reductions_setting() {
  const char* env = std::getenv("LAZYRT_FUSE_REDUCTIONS");
  const std::string_view v = env ? env : "";
  return v != "0" && v != "off";
}

const std::vector<const Backend*>& registry() {
  static const auto* all = new std::vector<const Backend*>{
      new CpuBackend("cpu", {kernels::kMaxFusedOps, kernels::kMaxFusedInputs, true, true, fuse_reductions_setting()}),
      new CpuBackend("reference", {0, 0, false, false, false}),
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

}  // namespace lazyrt
