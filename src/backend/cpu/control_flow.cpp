// While: cond and body are compiled once into sub-executables. The loop-carried values live
// in two sets of buffers in the step's workspace; the body reads one set and writes the
// other, then the sets swap. Nothing is allocated per iteration, and the memory used does
// not depend on the trip count.
//
// Since the sets only alternate, each iteration runs over one of two fixed arrangements of
// buffers (parity 0: read set A, write set B; parity 1: the reverse). Both are bound into the
// sub-executables once per run of the loop, so an iteration is the cond's kernels, a flag
// test, the body's kernels and any copies the body needs, with no pointer resolution.
//
// A loop whose operands all have one element and whose cond and body are ops the code
// generator takes (elementwise ops, casts, constants, where; reshapes of one element dropped)
// is also handed to the graph's jit::Module as one region: once hot, the whole loop runs as
// one generated function, cond and body inlined, carries in registers (jit.h's LoopFn), with
// the same bits as the sub-executables.
#include "backend/cpu/control_flow.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "backend/cpu/kernels/ops.h"
#include "util/metrics_cells.h"
#include "util/check.h"

namespace lazyrt::backend::cpu {

namespace {

using runtime::OutputSource;

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

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

// A loop's carries in two sets of workspace buffers: the body reads one set and writes the
// other, then they swap (parity 0: read A, write B; parity 1: the reverse). A carry the body
// returns unchanged (identity) stays in set A whatever the parity.
struct CarrySets {
  std::vector<size_t> bytes, a, b;
  std::vector<bool> identity;

  /// Places the carries (the first `count` of `types`) from workspace offset `ws` on; `body`
  /// tells which it returns unchanged. Returns the workspace offset after them.
  size_t place(const std::vector<ir::TensorType>& types, size_t count, const runtime::Executable& body, size_t ws) {
    for (size_t k = 0; k < count; ++k) {
      bytes.push_back(types[k].bytes());
      const size_t set_bytes = align64(types[k].bytes());
      a.push_back(ws);
      ws = detail::bytes_add(ws, set_bytes, "loop carries");
      b.push_back(ws);
      ws = detail::bytes_add(ws, set_bytes, "loop carries");
      const OutputSource& s = body.outputs()[k];
      identity.push_back(s.kind == OutputSource::Kind::Param && s.index == static_cast<int32_t>(k));
    }
    return ws;
  }
  size_t size() const { return bytes.size(); }
  char* read(char* ws, size_t k, int parity) const { return ws + (parity == 0 || identity[k] ? a[k] : b[k]); }
  char* write(char* ws, size_t k, int parity) const { return ws + (parity == 0 || identity[k] ? b[k] : a[k]); }
  void copy_in(char* ws, const void* const* in) const {
    for (size_t k = 0; k < size(); ++k)
      if (bytes[k]) std::memcpy(ws + a[k], in[k], bytes[k]);
  }
  void copy_out(char* ws, void* const* out, int parity) const {
    for (size_t k = 0; k < size(); ++k)
      if (bytes[k]) std::memcpy(out[k], read(ws, k, parity), bytes[k]);
  }
};

struct WhileState {
  std::shared_ptr<runtime::Executable> cond, body;
  // A loop of one-element values the code generator takes: its generated whole loop, once
  // compiled (until then the sub-executables run, and their iterations count toward it).
  std::shared_ptr<jit::Module> generated;
  int generated_index = -1;
  int64_t ops_per_iteration = 0;
  metrics::detail::CounterCell* generated_runs = nullptr;
  size_t carries = 0, operands = 0;
  CarrySets sets;
  size_t cond_offset = 0;
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

// Binds parity p: the body reads set A and writes set B when p is 0, the reverse when 1. A
// carry the body returns unchanged stays in set A whatever the parity.
void arrange(WhileState& st, int p, char* ws, const void* const* in, void* cond_out) {
  WhileState::Arrangement& a = st.parity[p];
  for (size_t k = 0; k < st.carries; ++k) {
    a.params[k] = st.sets.read(ws, k, p);
    a.next[k] = st.sets.write(ws, k, p);
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
    if (st.sets.identity[k] || !st.sets.bytes[k] || st.body->outputs()[k].kind == OutputSource::Kind::Computed)
      continue;
    a.copies.emplace_back(a.next[k], output_ptr(*st.body, k, a.params.data(), a.next.data()));
    a.copy_bytes.push_back(st.sets.bytes[k]);
  }
}

void run_while(WhileState& st, const void* const* in, void* const* out) {
  if (st.generated_index >= 0)
    if (jit::LoopFn fn = st.generated->loop_fn(st.generated_index)) {
      fn(in, out);
      st.generated_runs->add(1);
      return;
    }
  char* ws = static_cast<char*>(out[st.carries]);
  void* cond_out = ws + st.cond_offset;
  arrange(st, 0, ws, in, cond_out);
  arrange(st, 1, ws, in, cond_out);
  st.sets.copy_in(ws, in);
  int p = 0;
  int64_t iterations = 0;
  while (true) {
    WhileState::Arrangement& a = st.parity[p];
    st.cond->run_bound(a.cond);
    if (!*a.pred) break;
    st.body->run_bound(a.body);
    for (size_t c = 0; c < a.copies.size(); ++c)
      std::memcpy(a.copies[c].first, a.copies[c].second, a.copy_bytes[c]);
    p ^= 1;
    ++iterations;
  }
  st.sets.copy_out(ws, out, p);
  if (st.generated_index >= 0)
    st.generated->ran_interpreted(st.generated, st.generated_index, (iterations + 1) * st.ops_per_iteration);
}

// A loop region for the code generator: the ops that only reshape one element (reshape,
// expand, permute, flip, slice, stop_gradient) dropped, their readers reading their operand.
// Parameters keep their indices (the loop's operands).
ir::Graph without_one_element_reshapes(const ir::Graph& g) {
  ir::Graph out;
  out.num_params = g.num_params;
  std::vector<ir::ValueRef> to(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    const bool reshape = (n.op == ir::OpKind::Reshape || n.op == ir::OpKind::Expand || n.op == ir::OpKind::Permute ||
                          n.op == ir::OpKind::Flip || n.op == ir::OpKind::Slice || n.op == ir::OpKind::StopGradient) &&
                         n.operands.size() == 1 && g.type(n.operands[0]).numel() == 1 && n.results.size() == 1 &&
                         n.results[0].numel() == 1 && n.results[0].dtype == g.type(n.operands[0]).dtype;
    if (reshape) {
      to[i] = to[static_cast<size_t>(n.operands[0].node)];
      continue;
    }
    ir::Node copy = n;
    for (ir::ValueRef& v : copy.operands) v = to[static_cast<size_t>(v.node)];
    out.nodes.push_back(std::move(copy));
    to[i] = {static_cast<int32_t>(out.nodes.size() - 1), 0};
  }
  for (ir::ValueRef v : g.outputs) out.outputs.push_back(to[static_cast<size_t>(v.node)]);
  return out;
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
  CarrySets sets;
  std::vector<size_t> x_row, y_row;    // bytes of one row, per stacked input and output
  // Scratch for one run, sized at lowering so that running allocates nothing.
  runtime::Executable::Binding binding;
  std::vector<const void*> params;
  std::vector<void*> outs;
};

void run_scan(ScanState& st, const void* const* in, void* const* out) {
  char* ws = static_cast<char*>(out[st.carries + st.ys]);
  st.sets.copy_in(ws, in);
  for (size_t j = st.carries + st.xs; j < st.operands; ++j) st.params[j] = in[j];
  const size_t results = st.carries + st.ys;
  int p = 0;
  for (int64_t t = 0; t < st.length; ++t) {
    const int64_t r = st.reverse ? st.length - 1 - t : t;
    for (size_t k = 0; k < st.carries; ++k) {
      st.params[k] = st.sets.read(ws, k, p);
      st.outs[k] = st.sets.write(ws, k, p);
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
      const size_t bytes = k < st.carries ? st.sets.bytes[k] : st.y_row[k - st.carries];
      if ((k < st.carries && st.sets.identity[k]) || !bytes ||
          st.body->outputs()[k].kind == OutputSource::Kind::Computed)
        continue;
      std::memcpy(st.outs[k], output_ptr(*st.body, k, st.params.data(), st.outs.data()), bytes);
    }
    p ^= 1;
  }
  st.sets.copy_out(ws, out, p);
}

using Compiled = std::vector<std::shared_ptr<runtime::Executable>>;

// The executables compile/ made of a node's regions (RegionExecutables), `count` of them.
const Compiled& regions_of(const ir::Node& n, const Compiled& compiled, size_t count) {
  LAZYRT_ASSERT(compiled.size() == count, ir::op_name(n.op), " lowered without its ", count,
                " compiled regions (compile::lower makes them)");
  return compiled;
}

kernels::Kernel lower_scan(const ir::Node& n, const std::vector<ir::TensorType>& operands, const Compiled& compiled) {
  auto st = std::make_shared<ScanState>();
  st->body = regions_of(n, compiled, 1)[0];
  const ir::NodeAttrs at(n.op, n.attrs);
  st->carries = static_cast<size_t>(at.i<"carries">());
  st->xs = static_cast<size_t>(at.i<"xs">());
  st->ys = n.results.size() - st->carries;
  st->operands = operands.size();
  st->length = at.i<"length">();
  st->reverse = at.b<"reverse">();
  const size_t ws = st->sets.place(operands, st->carries, *st->body, 0);
  auto row_bytes = [&](const ir::TensorType& t) { return st->length ? t.bytes() / static_cast<size_t>(st->length) : 0; };
  for (size_t j = 0; j < st->xs; ++j) st->x_row.push_back(row_bytes(operands[st->carries + j]));
  for (size_t m = 0; m < st->ys; ++m) st->y_row.push_back(row_bytes(n.results[st->carries + m]));
  st->binding = st->body->make_binding();
  st->params.assign(st->operands, nullptr);
  st->outs.assign(st->carries + st->ys, nullptr);
  return {[st](const void* const* in, void* const* out) { run_scan(*st, in, out); }, ws};
}

// ---- scan_vjp: a scan's backward with binomial checkpointing --------------------------------
// A scan over the rows in the other order of the vector-Jacobian body, whose rows begin with
// the forward's carries at that row. Those are rebuilt by running the forward body from at
// most `snapshots` stored states, by Griewank's binomial schedule (revolve): reversing n rows
// with s states, the first of them at the start, costs r*n - C(s+r, s+1) forward steps, r the
// least with C(s+r, s) >= n, and memory for s + 2 states whatever n is.
//
// A length of -1 is counted when the node runs: its last operand holds it (the trip count of
// a while loop, or of a fori_loop whose bounds are inputs), so one executable serves every
// count. Nothing is stacked then. Its s stored states are planned in the workspace as usual;
// snapshots 0 keeps every state, s = n, in memory held for the run only.

// The least r with C(s + r, s) >= n, and C(s + r, s) for given s, r (0 where r < 0).
int64_t binomial(int64_t s, int64_t r) {
  if (r < 0 || s < 0) return 0;
  __int128 b = 1;
  for (int64_t i = 1; i <= r; ++i) b = b * (s + i) / i;  // C(s+i, s), exact at every step
  return b > INT64_MAX ? INT64_MAX : static_cast<int64_t>(b);
}

int64_t repetitions(int64_t n, int64_t s) {
  int64_t r = 0;
  while (binomial(s, r) < n) ++r;
  return r;
}

// Where to place the next stored state when reversing n rows with s states (s >= 2), so
// that the total of forward steps is the least possible.
int64_t revolve_split(int64_t n, int64_t s) {
  const int64_t r = repetitions(n, s);
  return std::min<int64_t>(std::max<int64_t>({n - binomial(s - 1, r), binomial(s, r - 2), 1}), n - 1);
}

struct ScanVjpState {
  std::shared_ptr<runtime::Executable> vjp, fwd;
  const Backend* backend = nullptr;  // where every state is kept (snapshots 0)
  size_t B = 0, XS = 0, K = 0, C = 0, FX = 0, P = 0, Y = 0;
  int64_t length = 0, snapshots = 1;  // snapshots 0: every state (counted length only)
  bool fwd_reverse = false;
  bool counted = false;  // the length is the last operand
  CarrySets bw;                              // the backward carries
  std::vector<size_t> st_bytes, st_off;      // forward carries: bytes, offset within a state set
  size_t st_set = 0;                         // bytes of one state set (aligned)
  size_t work = 0, snaps = 0;                // workspace offsets: two work sets, the stored sets
  std::vector<size_t> x_row, y_row;
  metrics::detail::CounterCell* steps = nullptr;
  // Scratch of one run.
  runtime::Executable::Binding vjp_binding, fwd_binding;
  std::vector<const void*> vjp_params, fwd_params;
  std::vector<void*> vjp_outs, fwd_outs;
  const void* const* in = nullptr;
  void* const* out = nullptr;
  char* ws = nullptr;
  char* store = nullptr;  // the stored state sets: in the workspace, or held for the run
  int parity = 0;  // which backward set holds the current carries

  int64_t row(int64_t t) const { return fwd_reverse ? length - 1 - t : t; }
  char* work_set(int w) const { return ws + work + static_cast<size_t>(w) * st_set; }
  char* stored(int64_t slot) const { return store + static_cast<size_t>(slot) * st_set; }

  // Copies the outputs an executable did not compute into their places.
  static void copy_rest(const runtime::Executable& exe, const std::vector<const void*>& params,
                        const std::vector<void*>& outs, size_t first, size_t count,
                        const std::function<size_t(size_t)>& bytes) {
    for (size_t k = first; k < first + count; ++k)
      if (bytes(k) && exe.outputs()[k].kind != OutputSource::Kind::Computed)
        std::memcpy(outs[k], output_ptr(exe, k, params.data(), outs.data()), bytes(k));
  }

  // One forward step, row t: the state set at `from` to the one at `to`.
  void forward(int64_t t, const char* from, char* to) {
    const int64_t r = row(t);
    for (size_t k = 0; k < C; ++k) {
      fwd_params[k] = from + st_off[k];
      fwd_outs[k] = to + st_off[k];
    }
    for (size_t j = 0; j < FX; ++j) fwd_params[C + j] = static_cast<const char*>(in[B + j]) + r * x_row[j];
    fwd->bind(fwd_binding, fwd_params.data(), fwd_outs.data());
    fwd->run_bound(fwd_binding);
    copy_rest(*fwd, fwd_params, fwd_outs, 0, C, [&](size_t k) { return st_bytes[k]; });
    steps->add(1);
  }

  // The state at row t0 + m, from the state set at `start` (row t0): `start` itself, or a
  // work set.
  const char* advance(const char* start, int64_t t0, int64_t m) {
    if (m == 0) return start;
    forward(t0, start, work_set(0));
    int w = 0;
    for (int64_t i = 1; i < m; ++i, w ^= 1) forward(t0 + i, work_set(w), work_set(w ^ 1));
    return work_set(w);
  }

  // The backward step of row t, from the forward state at `state`.
  void reverse_step(int64_t t, const char* state) {
    const int64_t r = row(t);
    for (size_t k = 0; k < B; ++k) {
      vjp_params[k] = bw.read(ws, k, parity);
      vjp_outs[k] = bw.write(ws, k, parity);
    }
    for (size_t k = 0; k < C; ++k) vjp_params[B + k] = state + st_off[k];
    for (size_t j = 0; j < XS; ++j)
      vjp_params[B + C + j] = static_cast<const char*>(in[B + j]) + r * x_row[j];
    for (size_t m = 0; m < Y; ++m) vjp_outs[B + m] = static_cast<char*>(out[B + m]) + r * y_row[m];
    vjp->bind(vjp_binding, vjp_params.data(), vjp_outs.data());
    vjp->run_bound(vjp_binding);
    copy_rest(*vjp, vjp_params, vjp_outs, 0, B + Y, [&](size_t k) {
      return k < B ? (bw.identity[k] ? 0 : bw.bytes[k]) : y_row[k - B];
    });
    parity ^= 1;
  }

  // Reverses rows t0 .. t0+n-1, the state at t0 being in stored set `slot`, with `s` stored
  // sets from `slot` on.
  void reverse(int64_t t0, int64_t n, int64_t slot, int64_t s) {
    if (n <= 0) return;
    if (n == 1) return reverse_step(t0, stored(slot));
    if (s >= n) {  // every state stored: revolve's schedule, without n levels of recursion
      for (int64_t j = 1; j < n; ++j) forward(t0 + j - 1, stored(slot + j - 1), stored(slot + j));
      for (int64_t j = n - 1; j >= 0; --j) reverse_step(t0 + j, stored(slot + j));
      return;
    }
    if (s == 1) {
      for (int64_t j = n - 1; j >= 0; --j) reverse_step(t0 + j, advance(stored(slot), t0, j));
      return;
    }
    const int64_t m = revolve_split(n, s);
    std::memcpy(stored(slot + 1), advance(stored(slot), t0, m), st_set);
    reverse(t0 + m, n - m, slot + 1, s - 1);
    reverse(t0, m, slot, s);
  }

  void run(const void* const* in_, void* const* out_) {
    in = in_;
    out = out_;
    ws = static_cast<char*>(out[B + Y]);
    parity = 0;
    if (counted) length = std::max<int64_t>(*static_cast<const int64_t*>(in[B + XS + K + C]), 0);
    const int64_t s = snapshots > 0 ? std::min<int64_t>(snapshots, std::max<int64_t>(length, 1))
                                    : std::max<int64_t>(length, 1);
    std::shared_ptr<runtime::Buffer> held;  // every state: tensor memory, counted as such
    if (snapshots > 0) {
      store = ws + snaps;
    } else {
      const size_t bytes = detail::bytes_mul(static_cast<size_t>(s), st_set, "scan_vjp: every state");
      try {
        held = backend->allocate(bytes);
      } catch (const Error& e) {
        throw Error(detail::str_cat("scan_vjp: keeping every state of ", length, " rows (", bytes,
                                    " bytes): ", e.what(), "; give the loop a number of snapshots"));
      }
      store = static_cast<char*>(held->data());
    }
    bw.copy_in(ws, in);
    const size_t first_state = B + XS + K;
    for (size_t k = 0; k < C; ++k)
      if (st_bytes[k]) std::memcpy(stored(0) + st_off[k], in[first_state + k], st_bytes[k]);
    for (size_t q = 0; q < K; ++q) vjp_params[B + C + XS + q] = in[B + XS + q];
    for (size_t q = 0; q < P; ++q) fwd_params[C + FX + q] = in[B + XS + q];
    reverse(0, length, 0, s);
    bw.copy_out(ws, out, parity);
  }
};

kernels::Kernel lower_scan_vjp(const ir::Node& n, const std::vector<ir::TensorType>& operands, const Compiled& compiled,
                               const Backend& backend) {
  auto st = std::make_shared<ScanVjpState>();
  st->backend = &backend;
  const ir::NodeAttrs at(n.op, n.attrs);
  st->B = static_cast<size_t>(at.i<"carries">());
  st->XS = static_cast<size_t>(at.i<"xs">());
  st->C = static_cast<size_t>(at.i<"states">());
  st->FX = static_cast<size_t>(at.i<"state_xs">());
  st->P = static_cast<size_t>(at.i<"state_captures">());
  st->counted = at.i<"length">() == -1;
  st->K = operands.size() - st->B - st->XS - st->C - (st->counted ? 1 : 0);
  st->Y = n.results.size() - st->B;
  st->length = st->counted ? 0 : at.i<"length">();
  st->fwd_reverse = at.b<"reverse">();
  st->snapshots = at.i<"snapshots">();
  st->vjp = regions_of(n, compiled, 2)[0];
  st->fwd = compiled[1];  // the forward's carries only
  size_t ws = st->bw.place(operands, st->B, *st->vjp, 0);
  for (size_t k = 0; k < st->C; ++k) {
    const ir::TensorType& t = operands[st->B + st->XS + st->K + k];
    st->st_bytes.push_back(t.bytes());
    st->st_off.push_back(st->st_set);
    st->st_set = detail::bytes_add(st->st_set, align64(t.bytes()), "scan_vjp: the carries");
  }
  st->work = ws;
  ws = detail::bytes_add(ws, detail::bytes_mul(2, st->st_set, "scan_vjp: the work sets"), "scan_vjp: the workspace");
  st->snaps = ws;
  const int64_t planned = st->counted ? st->snapshots
                                      : std::min<int64_t>(st->snapshots, std::max<int64_t>(st->length, 1));
  ws = detail::bytes_add(ws, detail::bytes_mul(static_cast<size_t>(planned), st->st_set, "scan_vjp: the stored states"),
                         "scan_vjp: the workspace");
  auto row_bytes = [&](const ir::TensorType& t) { return st->length ? t.bytes() / static_cast<size_t>(st->length) : 0; };
  for (size_t j = 0; j < st->XS; ++j) st->x_row.push_back(row_bytes(operands[st->B + j]));
  for (size_t m = 0; m < st->Y; ++m) st->y_row.push_back(row_bytes(n.results[st->B + m]));
  st->steps = &metrics::detail::counter_cell("CheckpointForwardSteps");
  st->vjp_binding = st->vjp->make_binding();
  st->fwd_binding = st->fwd->make_binding();
  st->vjp_params.assign(st->B + st->C + st->XS + st->K, nullptr);
  st->vjp_outs.assign(st->B + st->Y, nullptr);
  st->fwd_params.assign(st->C + st->FX + st->P, nullptr);
  st->fwd_outs.assign(st->C, nullptr);
  return {[st](const void* const* in, void* const* out) { st->run(in, out); }, ws};
}

}  // namespace

kernels::Kernel lower_control_flow(const ir::Node& n, const std::vector<ir::TensorType>& operands,
                                   const Compiled& compiled, const Backend& backend,
                                   const std::shared_ptr<jit::Module>& generated) {
  if (n.op == ir::OpKind::Fusion) return kernels::make_fused(*n.regions[0], operands, n.results, n.attrs, generated);
  if (n.op == ir::OpKind::Scan) return lower_scan(n, operands, compiled);
  if (n.op == ir::OpKind::ScanVjp) return lower_scan_vjp(n, operands, compiled, backend);
  LAZYRT_ASSERT(n.op == ir::OpKind::While, "no lowering for ", ir::op_name(n.op));
  auto st = std::make_shared<WhileState>();
  st->cond = regions_of(n, compiled, 2)[0];
  st->body = compiled[1];
  st->carries = static_cast<size_t>(ir::NodeAttrs(n.op, n.attrs).i<"carries">());
  st->operands = operands.size();
  if (generated && std::all_of(operands.begin(), operands.end(), [](const ir::TensorType& t) { return t.numel() == 1; })) {
    jit::FusedRegion r{without_one_element_reshapes(*n.regions[1]), {}, without_one_element_reshapes(*n.regions[0])};
    // Toward the module's compile threshold (in element-ops), an interpreted iteration counts
    // each of its ops as several: one-element kernels cost their dispatch, not their element.
    constexpr int64_t kOneElementOpCost = 8;
    for (const ir::Graph* g : {&r.region, &*r.cond})
      for (const ir::Node& node : g->nodes)
        st->ops_per_iteration += node.op == ir::OpKind::Parameter || node.op == ir::OpKind::Full ? 0 : kOneElementOpCost;
    st->generated_index = generated->add(std::move(r));
    if (st->generated_index >= 0) {
      st->generated = generated;
      st->generated_runs = &metrics::detail::counter_cell("GeneratedLoopRuns");
    }
  }
  size_t ws = st->sets.place(operands, st->carries, *st->body, 0);
  st->cond_offset = ws;
  ws += 64;
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

}  // namespace lazyrt::backend::cpu
