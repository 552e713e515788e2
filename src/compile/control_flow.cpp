// While: cond and body are compiled once into sub-executables. The loop-carried values live
// in two sets of buffers in the step's workspace; the body reads one set and writes the
// other, then the sets swap. Nothing is allocated per iteration, and the memory used does
// not depend on the trip count.
//
// Since the sets only alternate, each iteration runs over one of two fixed arrangements of
// buffers (parity 0: read set A, write set B; parity 1: the reverse). Both are bound into the
// sub-executables once per run of the loop, so an iteration is the cond's kernels, a flag
// test, the body's kernels and any copies the body needs, with no pointer resolution.
#include "compile/control_flow.h"

#include <cstring>

#include "compile/compile.h"
#include "kernels/cpu/ops.h"
#include "util/check.h"

namespace lazyrt::compile {
namespace {

using runtime::OutputSource;

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

struct WhileState {
  std::shared_ptr<runtime::Executable> cond, body;
  size_t carries = 0, operands = 0;
  std::vector<size_t> bytes;             // per carry
  std::vector<size_t> set_a, set_b;      // per carry, workspace offsets
  size_t cond_offset = 0;
  std::vector<bool> identity;            // body returns carry k unchanged as output k
  // Per parity, bound on every run of the loop into storage sized here, so running allocates
  // nothing.
  struct Arrangement {
    std::vector<const void*> params;     // carries read (the current set), then captures
    std::vector<void*> next;             // per carry, where the body writes it
    runtime::Executable::Binding cond, body;
    const bool* pred = nullptr;          // the cond's result
    std::vector<std::pair<void*, const void*>> copies;  // outputs the body does not compute
    std::vector<size_t> copy_bytes;
  };
  Arrangement parity[2];
};

// Where output k of `exe` ended up after a run that wrote Computed outputs to `outs`.
const void* output_ptr(const runtime::Executable& exe, size_t k, const void* const* params,
                       void* const* outs) {
  const OutputSource& s = exe.outputs()[k];
  switch (s.kind) {
    case OutputSource::Kind::Computed: return outs[k];
    case OutputSource::Kind::Param: return params[s.index];
    case OutputSource::Kind::Const: return exe.constant_output(s.index)->data();
    case OutputSource::Kind::Alias: return outs[s.index];
  }
  return nullptr;
}

// Binds parity p: the body reads set A and writes set B when p is 0, the reverse when 1. A
// carry the body returns unchanged stays in set A whatever the parity.
void arrange(WhileState& st, int p, char* ws, const void* const* in, void* cond_out) {
  WhileState::Arrangement& a = st.parity[p];
  for (size_t k = 0; k < st.carries; ++k) {
    const bool read_a = p == 0 || st.identity[k];
    a.params[k] = ws + (read_a ? st.set_a[k] : st.set_b[k]);
    a.next[k] = ws + (read_a ? st.set_b[k] : st.set_a[k]);
  }
  for (size_t j = st.carries; j < st.operands; ++j) a.params[j] = in[j];
  void* cond_outs[1] = {cond_out};
  st.cond->bind(a.cond, a.params.data(), cond_outs);
  st.body->bind(a.body, a.params.data(), a.next.data());
  a.pred = static_cast<const bool*>(output_ptr(*st.cond, 0, a.params.data(), cond_outs));
  // Outputs the body did not compute into `next` are copied there after it runs, reading the
  // current set, which the body leaves intact.
  a.copies.clear();
  a.copy_bytes.clear();
  for (size_t k = 0; k < st.carries; ++k) {
    if (st.identity[k] || !st.bytes[k] || st.body->outputs()[k].kind == OutputSource::Kind::Computed)
      continue;
    a.copies.emplace_back(a.next[k], output_ptr(*st.body, k, a.params.data(), a.next.data()));
    a.copy_bytes.push_back(st.bytes[k]);
  }
}

void run_while(WhileState& st, const void* const* in, void* const* out) {
  char* ws = static_cast<char*>(out[st.carries]);
  void* cond_out = ws + st.cond_offset;
  arrange(st, 0, ws, in, cond_out);
  arrange(st, 1, ws, in, cond_out);
  for (size_t k = 0; k < st.carries; ++k)
    if (st.bytes[k]) std::memcpy(ws + st.set_a[k], in[k], st.bytes[k]);
  int p = 0;
  while (true) {
    WhileState::Arrangement& a = st.parity[p];
    st.cond->run_bound(a.cond);
    if (!*a.pred) break;
    st.body->run_bound(a.body);
    for (size_t c = 0; c < a.copies.size(); ++c)
      std::memcpy(a.copies[c].first, a.copies[c].second, a.copy_bytes[c]);
    p ^= 1;
  }
  const WhileState::Arrangement& last = st.parity[p];
  for (size_t k = 0; k < st.carries; ++k)
    if (st.bytes[k]) std::memcpy(out[k], last.params[k], st.bytes[k]);
}

// ---- scan ----------------------------------------------------------------------------------
// The carries alternate between two sets, as in a while. Row r of each stacked input is read
// where it lies, and row r of each stacked output is written where it belongs: the body is
// bound to those pointers before each iteration (a patch of its parameter and output
// arguments), so no row is copied unless the body returns it without computing it.

struct ScanState {
  std::shared_ptr<runtime::Executable> body;
  size_t carries = 0, xs = 0, ys = 0, operands = 0;
  int64_t length = 0;
  bool reverse = false;
  std::vector<size_t> bytes;           // per carry
  std::vector<size_t> set_a, set_b;    // per carry, workspace offsets
  std::vector<bool> identity;          // the body returns carry k unchanged
  std::vector<size_t> x_row, y_row;    // bytes of one row, per stacked input and output
  // Scratch for one run, sized at lowering so that running allocates nothing.
  runtime::Executable::Binding binding;
  std::vector<const void*> params;
  std::vector<void*> outs;
};

void run_scan(ScanState& st, const void* const* in, void* const* out) {
  char* ws = static_cast<char*>(out[st.carries + st.ys]);
  for (size_t k = 0; k < st.carries; ++k)
    if (st.bytes[k]) std::memcpy(ws + st.set_a[k], in[k], st.bytes[k]);
  for (size_t j = st.carries + st.xs; j < st.operands; ++j) st.params[j] = in[j];
  const size_t results = st.carries + st.ys;
  int p = 0;
  for (int64_t t = 0; t < st.length; ++t) {
    const int64_t r = st.reverse ? st.length - 1 - t : t;
    for (size_t k = 0; k < st.carries; ++k) {
      const bool read_a = p == 0 || st.identity[k];
      st.params[k] = ws + (read_a ? st.set_a[k] : st.set_b[k]);
      st.outs[k] = ws + (read_a ? st.set_b[k] : st.set_a[k]);
    }
    for (size_t j = 0; j < st.xs; ++j)
      st.params[st.carries + j] = static_cast<const char*>(in[st.carries + j]) + r * st.x_row[j];
    for (size_t m = 0; m < st.ys; ++m)
      st.outs[st.carries + m] = static_cast<char*>(out[st.carries + m]) + r * st.y_row[m];
    st.body->bind(st.binding, st.params.data(), st.outs.data());
    st.body->run_bound(st.binding);
    // Results the body did not compute into their place: copied there, from values the body
    // leaves intact (the current carries, the rows read, constants, computed results).
    for (size_t k = 0; k < results; ++k) {
      const size_t bytes = k < st.carries ? st.bytes[k] : st.y_row[k - st.carries];
      if ((k < st.carries && st.identity[k]) || !bytes ||
          st.body->outputs()[k].kind == OutputSource::Kind::Computed)
        continue;
      std::memcpy(st.outs[k], output_ptr(*st.body, k, st.params.data(), st.outs.data()), bytes);
    }
    p ^= 1;
  }
  for (size_t k = 0; k < st.carries; ++k) {
    const bool in_a = p == 0 || st.identity[k];
    if (st.bytes[k]) std::memcpy(out[k], ws + (in_a ? st.set_a[k] : st.set_b[k]), st.bytes[k]);
  }
}

kernels::Kernel lower_scan(const ir::Node& n, const std::vector<ir::TensorType>& operands) {
  auto st = std::make_shared<ScanState>();
  st->body = compile(*n.regions[0]);
  const ir::NodeAttrs at(n.op, n.attrs);
  st->carries = static_cast<size_t>(at.i<"carries">());
  st->xs = static_cast<size_t>(at.i<"xs">());
  st->ys = n.results.size() - st->carries;
  st->operands = operands.size();
  st->length = at.i<"length">();
  st->reverse = at.b<"reverse">();
  size_t ws = 0;
  for (size_t k = 0; k < st->carries; ++k) {
    st->bytes.push_back(operands[k].bytes());
    st->set_a.push_back(ws);
    ws += align64(operands[k].bytes());
    st->set_b.push_back(ws);
    ws += align64(operands[k].bytes());
    const OutputSource& s = st->body->outputs()[k];
    st->identity.push_back(s.kind == OutputSource::Kind::Param && s.index == static_cast<int32_t>(k));
  }
  auto row_bytes = [&](const ir::TensorType& t) { return st->length ? t.bytes() / static_cast<size_t>(st->length) : 0; };
  for (size_t j = 0; j < st->xs; ++j) st->x_row.push_back(row_bytes(operands[st->carries + j]));
  for (size_t m = 0; m < st->ys; ++m) st->y_row.push_back(row_bytes(n.results[st->carries + m]));
  st->binding = st->body->make_binding();
  st->params.assign(st->operands, nullptr);
  st->outs.assign(st->carries + st->ys, nullptr);
  return {[st](const void* const* in, void* const* out) { run_scan(*st, in, out); }, ws};
}

}  // namespace

kernels::Kernel lower_control_flow(const ir::Node& n, const std::vector<ir::TensorType>& operands) {
  if (n.op == ir::OpKind::Fusion) return kernels::make_fused(*n.regions[0], operands, n.results);
  if (n.op == ir::OpKind::Scan) return lower_scan(n, operands);
  LAZYRT_ASSERT(n.op == ir::OpKind::While, "no lowering for ", ir::op_name(n.op));
  auto st = std::make_shared<WhileState>();
  st->cond = compile(*n.regions[0]);
  st->body = compile(*n.regions[1]);
  st->carries = static_cast<size_t>(ir::NodeAttrs(n.op, n.attrs).i<"carries">());
  st->operands = operands.size();
  size_t ws = 0;
  for (size_t k = 0; k < st->carries; ++k) {
    st->bytes.push_back(operands[k].bytes());
    st->set_a.push_back(ws);
    ws += align64(operands[k].bytes());
    st->set_b.push_back(ws);
    ws += align64(operands[k].bytes());
  }
  st->cond_offset = ws;
  ws += 64;
  for (size_t k = 0; k < st->carries; ++k) {
    const OutputSource& s = st->body->outputs()[k];
    st->identity.push_back(s.kind == OutputSource::Kind::Param && s.index == static_cast<int32_t>(k));
  }
  for (WhileState::Arrangement& a : st->parity) {
    a.params.assign(st->operands, nullptr);
    a.next.assign(st->carries, nullptr);
    a.cond = st->cond->make_binding();
    a.body = st->body->make_binding();
    a.copies.reserve(st->carries);
    a.copy_bytes.reserve(st->carries);
  }
  return {[st](const void* const* in, void* const* out) { run_while(*st, in, out); }, ws};
}

}  // namespace lazyrt::compile
