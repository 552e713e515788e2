// While: cond and body are compiled once into sub-executables. The loop-carried values live
// in two sets of buffers in the step's workspace; the body reads one set and writes the
// other, then the sets swap. Nothing is allocated per iteration, and the memory used does
// not depend on the trip count.
#include "compile/control_flow.h"

#include <cstring>

#include "compile/compile.h"
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
  // Scratch bound per run; sized here so running allocates nothing.
  std::vector<const void*> params;       // carries, then captures
  std::vector<void*> cur, next;
  std::vector<bool> identity;            // body returns carry k unchanged as output k
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

void run_while(WhileState& st, const void* const* in, void* const* out) {
  char* ws = static_cast<char*>(out[st.carries]);
  for (size_t k = 0; k < st.carries; ++k) {
    st.cur[k] = ws + st.set_a[k];
    st.next[k] = ws + st.set_b[k];
    if (st.bytes[k]) std::memcpy(st.cur[k], in[k], st.bytes[k]);
    st.params[k] = st.cur[k];
  }
  for (size_t j = st.carries; j < st.operands; ++j) st.params[j] = in[j];
  void* cond_out[1] = {ws + st.cond_offset};
  const void* const* params = st.params.data();
  while (true) {
    st.cond->run_unlocked(params, cond_out);
    if (!*static_cast<const bool*>(output_ptr(*st.cond, 0, params, cond_out))) break;
    st.body->run_unlocked(params, st.next.data());
    // Outputs the body did not compute into `next` are copied there, reading the current set
    // before any swap.
    for (size_t k = 0; k < st.carries; ++k) {
      if (st.identity[k] || st.body->outputs()[k].kind == OutputSource::Kind::Computed) continue;
      const void* src = output_ptr(*st.body, k, params, st.next.data());
      if (st.bytes[k]) std::memcpy(st.next[k], src, st.bytes[k]);
    }
    for (size_t k = 0; k < st.carries; ++k) {
      if (st.identity[k]) continue;
      std::swap(st.cur[k], st.next[k]);
      st.params[k] = st.cur[k];
    }
  }
  for (size_t k = 0; k < st.carries; ++k)
    if (st.bytes[k]) std::memcpy(out[k], st.cur[k], st.bytes[k]);
}

}  // namespace

kernels::Kernel lower_control_flow(const ir::Node& n, const std::vector<ir::TensorType>& operands) {
  LAZYRT_ASSERT(n.op == ir::OpKind::While, "no lowering for ", ir::op_name(n.op));
  auto st = std::make_shared<WhileState>();
  st->cond = compile(*n.regions[0]);
  st->body = compile(*n.regions[1]);
  st->carries = static_cast<size_t>(n.attrs.i(0));
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
  st->params.assign(st->operands, nullptr);
  st->cur.assign(st->carries, nullptr);
  st->next.assign(st->carries, nullptr);
  for (size_t k = 0; k < st->carries; ++k) {
    const OutputSource& s = st->body->outputs()[k];
    st->identity.push_back(s.kind == OutputSource::Kind::Param && s.index == static_cast<int32_t>(k));
  }
  return {[st](const void* const* in, void* const* out) { run_while(*st, in, out); }, ws};
}

}  // namespace lazyrt::compile
