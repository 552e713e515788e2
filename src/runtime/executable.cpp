#include "runtime/executable.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>

#include "util/check.h"
#include "util/denormals.h"
#include "lazyrt/metrics.h"
#include "util/metrics_cells.h"

namespace lazyrt::runtime {

namespace {
std::atomic<int64_t> next_executable{1};
}  // namespace

Executable::Executable(Parts parts) : parts_(std::move(parts)), id_(next_executable.fetch_add(1)) {
  LAZYRT_ASSERT(!parts_.arena_bytes || (parts_.arena && parts_.arena->bytes() >= parts_.arena_bytes),
                "an executable's arena of ", parts_.arena_bytes, " bytes was not allocated");
  auto* arena = parts_.arena ? static_cast<char*>(parts_.arena->data()) : nullptr;
  auto* consts = parts_.constants ? static_cast<char*>(parts_.constants->data()) : nullptr;
  auto resolve = [&](const Slot& s) -> void* {
    switch (s.kind) {
      case SlotKind::Arena: return arena + s.offset;
      case SlotKind::Const: return consts + s.offset;
      default: return nullptr;  // bound at run time
    }
  };
  for (const Step& st : parts_.steps) {
    const auto in_base = static_cast<uint32_t>(args_.size());
    for (const Slot& s : st.in) {
      if (s.kind == SlotKind::Param || s.kind == SlotKind::Output)
        patches_.push_back({static_cast<uint32_t>(args_.size()), s.kind, s.index});
      args_.push_back(resolve(s));
    }
    const auto out_base = static_cast<uint32_t>(args_.size());
    for (const Slot& s : st.out) {
      if (s.kind == SlotKind::Param || s.kind == SlotKind::Output)
        patches_.push_back({static_cast<uint32_t>(args_.size()), s.kind, s.index});
      args_.push_back(resolve(s));
    }
    bases_.emplace_back(in_base, out_base);
  }
}

Executable::~Executable() {
  if (step_cells_) metrics::detail::unregister_steps(step_cells_.get());
}

void Executable::run(const void* const* params, void* const* outputs) {
  std::lock_guard<std::mutex> lock(mu_);
  run_unlocked(params, outputs);
}

void Executable::run_unlocked(const void* const* params, void* const* outputs) {
  patch(args_, params, outputs);
  run_steps(args_.data());
}

void Executable::bind(Binding& b, const void* const* params, void* const* outputs) const {
  LAZYRT_ASSERT(b.args_.size() == args_.size(), "binding made for another executable");
  patch(b.args_, params, outputs);
}

void Executable::run_bound(const Binding& b) { run_steps(b.args_.data()); }

void Executable::patch(std::vector<void*>& args, const void* const* params,
                       void* const* outputs) const {
  for (const Patch& p : patches_)
    args[p.arg] = p.kind == SlotKind::Param ? const_cast<void*>(params[p.index]) : outputs[p.index];
}

void Executable::run_steps(void* const* args) {
  const util::FlushDenormals flushed;
  if (metrics::detail::kernel_timings_flag().load(std::memory_order_relaxed)) {
    run_steps_timed(args);
    return;
  }
  for (size_t i = 0; i < parts_.steps.size(); ++i)
    parts_.steps[i].fn(args + bases_[i].first, args + bases_[i].second);
}

void Executable::run_steps_timed(void* const* args) {
  static const auto cells = [] {
    std::array<metrics::detail::TimingCell*, ir::kNumOps> c{};
    for (size_t op = 0; op < ir::kNumOps; ++op)
      c[op] = &metrics::detail::timing_cell(std::string("Kernel:") + std::string(ir::op_name(static_cast<ir::OpKind>(op))));
    return c;
  }();
  if (!step_cells_) {
    std::vector<std::string> ops;
    std::vector<int64_t> bytes;
    for (const Step& st : parts_.steps) {
      ops.emplace_back(ir::op_name(st.op));
      bytes.push_back(st.bytes);
    }
    step_cells_ = std::make_unique<metrics::detail::StepCells>(id_, std::move(ops), std::move(bytes));
    metrics::detail::register_steps(step_cells_.get());
  }
  const bool alone = metrics::detail::kernel_timings_alone_flag().load(std::memory_order_relaxed);
  std::vector<std::pair<size_t, std::vector<char>>> saved;  // alone: operands a result overwrites
  for (size_t i = 0; i < parts_.steps.size(); ++i) {
    const Step& st = parts_.steps[i];
    const bool repeats = alone && save_overwritten(i, args, saved);
    auto timed_run = [&] {
      const auto start = std::chrono::steady_clock::now();
      st.fn(args + bases_[i].first, args + bases_[i].second);
      return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    };
    const int64_t ns = timed_run();
    cells[static_cast<size_t>(st.op)]->record(ns);
    step_cells_->record(i, ns);
    if (!repeats) continue;
    for (int k = 0; k < metrics::kAloneRuns; ++k) {
      for (const auto& [arg, bytes] : saved) std::memcpy(args[bases_[i].first + arg], bytes.data(), bytes.size());
      step_cells_->record_alone(i, timed_run());
    }
  }
}

bool Executable::save_overwritten(size_t i, void* const* args, std::vector<std::pair<size_t, std::vector<char>>>& saved) const {
  saved.clear();
  const Step& st = parts_.steps[i];
  const size_t n_in = st.in.size(), n = n_in + st.out.size();
  if (st.repeat_sizes.size() != n || st.out.empty()) return false;
  // Operands a result is written over (in place, or into a donated parameter's buffer) are
  // kept, and put back before each further run, so that it reads what the first one read.
  for (size_t k = 0; k < n_in; ++k) {
    const auto* ib = static_cast<const char*>(args[bases_[i].first + k]);
    const size_t in_bytes = st.repeat_sizes[k];
    for (size_t o = n_in; o < n; ++o) {
      const auto* ob = static_cast<const char*>(args[bases_[i].second + (o - n_in)]);
      if (in_bytes > 0 && ob < ib + in_bytes && ib < ob + std::max<size_t>(st.repeat_sizes[o], 1)) {
        saved.emplace_back(k, std::vector<char>(ib, ib + in_bytes));
        break;
      }
    }
  }
  return true;
}

ExecutableStats Executable::stats() const {
  return {parts_.steps.size(), parts_.arena_bytes, parts_.arena_blocks,
          parts_.constants ? parts_.constants->bytes() : 0};
}

size_t Executable::held_bytes() const {
  size_t bytes = parts_.arena_bytes + (parts_.constants ? parts_.constants->bytes() : 0);
  for (size_t i = 0; i < parts_.constant_outputs.size(); ++i) {
    const std::shared_ptr<Buffer>& b = parts_.constant_outputs[i];
    if (!b || b == parts_.constants) continue;
    bool seen = false;
    for (size_t j = 0; j < i && !seen; ++j) seen = parts_.constant_outputs[j] == b;
    if (!seen) bytes += b->bytes();
  }
  return bytes;
}

std::string Executable::to_text() const {
  auto slot = [](const Slot& s) {
    std::ostringstream os;
    switch (s.kind) {
      case SlotKind::Arena: os << "arena+" << s.offset; break;
      case SlotKind::Const: os << "const+" << s.offset; break;
      case SlotKind::Param: os << "param " << s.index; break;
      case SlotKind::Output: os << "out " << s.index; break;
    }
    return os.str();
  };
  std::ostringstream os;
  for (size_t i = 0; i < parts_.steps.size(); ++i) {
    const Step& st = parts_.steps[i];
    os << i << ": " << ir::op_name(st.op) << '(';
    for (size_t k = 0; k < st.in.size(); ++k) os << (k ? ", " : "") << slot(st.in[k]);
    os << ") ->";
    for (size_t k = 0; k < st.out.size(); ++k) os << (k ? ", " : " ") << slot(st.out[k]);
    os << '\n';
  }
  return os.str();
}

}  // namespace lazyrt::runtime
