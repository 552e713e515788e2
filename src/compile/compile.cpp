#include "compile/compile.h"

#include <algorithm>
#include <map>

#include "compile/memory_plan.h"
#include "compile/passes.h"
#include "kernels/cpu/ops.h"
#include "util/check.h"

namespace lazyrt::compile {

using ir::Graph;
using ir::Node;
using ir::OpKind;
using ir::ValueRef;
using runtime::OutputSource;
using runtime::Slot;
using runtime::SlotKind;

namespace {

// The kernel of `node` may write its result over operand k's buffer.
bool can_alias(const Graph& g, const Node& node, size_t k) {
  if (!ir::has_flag(node.op, ir::kInPlace) || node.results.size() != 1) return false;
  const ir::TensorType& in = g.type(node.operands[k]);
  if (ir::has_flag(node.op, ir::kElementwise)) return in == node.results[0];
  return k == 0 && in.bytes() == node.results[0].bytes();
}

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

std::shared_ptr<runtime::Executable> lower(const Graph& g, const std::vector<int32_t>& donations_in) {
  const size_t num_outputs = g.outputs.size();
  std::vector<int32_t> donations = donations_in;
  donations.resize(num_outputs, -1);

  runtime::Executable::Parts parts;
  parts.param_types.resize(static_cast<size_t>(g.num_params));
  for (const Node& n : g.nodes)
    if (n.op == OpKind::Parameter) parts.param_types[n.attrs.i(0)] = n.results[0];
  for (ValueRef v : g.outputs) parts.output_types.push_back(g.type(v));

  // Constants: filled once, here.
  size_t const_bytes = 0;
  std::vector<size_t> const_offset(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].op == OpKind::Full) {
      const_offset[i] = const_bytes;
      const_bytes += align64(g.nodes[i].results[0].bytes());
    }
  if (const_bytes) {
    parts.constants = runtime::allocate(const_bytes);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (g.nodes[i].op == OpKind::Full) {
        const Node& n = g.nodes[i];
        kernels::fill(static_cast<char*>(parts.constants->data()) + const_offset[i],
                      n.results[0].dtype, n.attrs.f(0), n.results[0].numel());
      }
  }

  // Steps in graph order; readers of every value and parameter.
  std::vector<int32_t> step_of(g.nodes.size(), -1);
  int32_t num_steps = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    OpKind op = g.nodes[i].op;
    if (op != OpKind::Parameter && op != OpKind::Full) step_of[i] = num_steps++;
  }
  std::vector<int32_t> last_read(g.nodes.size(), -1);
  std::vector<std::vector<int32_t>> param_readers(static_cast<size_t>(g.num_params));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (step_of[i] < 0) continue;
    for (ValueRef v : g.nodes[i].operands) {
      last_read[v.node] = std::max(last_read[v.node], step_of[i]);
      if (g.nodes[v.node].op == OpKind::Parameter)
        param_readers[g.nodes[v.node].attrs.i(0)].push_back(static_cast<int32_t>(i));
    }
  }

  // Output sources and donations.
  parts.outputs.resize(num_outputs);
  parts.donation_accepted.assign(num_outputs, false);
  std::map<ValueRef, int32_t> claimed;          // value -> the output it is written into
  std::vector<int32_t> copy_out_of;             // outputs computed aside, copied at the end
  std::vector<bool> param_returned(static_cast<size_t>(g.num_params), false);
  for (size_t k = 0; k < num_outputs; ++k) {
    const Node& n = g.node(g.outputs[k]);
    if (n.op == OpKind::Parameter) param_returned[n.attrs.i(0)] = true;
  }
  for (size_t k = 0; k < num_outputs; ++k) {
    ValueRef v = g.outputs[k];
    const Node& n = g.node(v);
    if (n.op == OpKind::Parameter) {
      parts.outputs[k] = {OutputSource::Kind::Param, static_cast<int32_t>(n.attrs.i(0))};
    } else if (n.op == OpKind::Full) {
      auto buf = runtime::allocate(n.results[0].bytes());
      kernels::fill(buf->data(), n.results[0].dtype, n.attrs.f(0), n.results[0].numel());
      parts.outputs[k] = {OutputSource::Kind::Const, static_cast<int32_t>(parts.constant_outputs.size())};
      parts.constant_outputs.push_back(std::move(buf));
    } else if (auto it = claimed.find(v); it != claimed.end()) {
      parts.outputs[k] = {OutputSource::Kind::Alias, it->second};
    } else {
      parts.outputs[k] = {OutputSource::Kind::Computed, 0};
      claimed[v] = static_cast<int32_t>(k);
      const int32_t p = donations[k];
      if (p >= 0 && !param_returned[p]) {
        parts.donation_accepted[k] = true;
        // Writing straight into the parameter is safe when every read of it comes first, or
        // is this step's own read of an operand it may overwrite.
        const int32_t s = step_of[v.node];
        bool direct = true;
        for (int32_t reader : param_readers[p]) {
          if (step_of[reader] < s) continue;
          if (step_of[reader] > s) { direct = false; break; }
          const Node& rn = g.nodes[reader];
          for (size_t o = 0; o < rn.operands.size(); ++o)
            if (g.node(rn.operands[o]).op == OpKind::Parameter &&
                g.node(rn.operands[o]).attrs.i(0) == p && !can_alias(g, rn, o))
              direct = false;
        }
        if (!direct) copy_out_of.push_back(static_cast<int32_t>(k));
      }
    }
  }

  // Arena requests: every step result not written straight to an output, and workspaces.
  std::vector<BufferRequest> reqs;
  std::vector<int32_t> req_of(g.nodes.size(), -1);
  std::vector<Slot> slot_of(g.nodes.size());
  std::vector<kernels::Kernel> made(g.nodes.size());
  std::vector<int32_t> workspace_req(g.nodes.size(), -1);
  std::vector<bool> computed_aside(num_outputs, false);
  for (int32_t k : copy_out_of) computed_aside[k] = true;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == OpKind::Parameter) {
      slot_of[i] = {SlotKind::Param, static_cast<int32_t>(n.attrs.i(0)), 0};
      continue;
    }
    if (n.op == OpKind::Full) {
      slot_of[i] = {SlotKind::Const, 0, const_offset[i]};
      continue;
    }
    LAZYRT_ASSERT(n.results.size() == 1, "multi-result ops are not lowered yet");
    std::vector<ir::TensorType> in_types;
    for (ValueRef v : n.operands) in_types.push_back(g.type(v));
    made[i] = kernels::make_kernel({n.op, n.attrs, in_types, n.results});
    const int32_t s = step_of[i];
    auto it = claimed.find({static_cast<int32_t>(i), 0});
    if (it != claimed.end() && !computed_aside[it->second]) {
      slot_of[i] = {SlotKind::Output, it->second, 0};
    } else {
      BufferRequest r;
      r.bytes = n.results[0].bytes();
      r.first = s;
      r.last = std::max(s, last_read[i]);
      if (it != claimed.end()) r.last = num_steps + static_cast<int32_t>(
          std::find(copy_out_of.begin(), copy_out_of.end(), it->second) - copy_out_of.begin());
      if (!n.operands.empty() && can_alias(g, n, 0)) {
        int32_t src = req_of[n.operands[0].node];
        if (src >= 0 && reqs[src].last == s) r.inplace_of = src;
      }
      req_of[i] = static_cast<int32_t>(reqs.size());
      reqs.push_back(r);
    }
    if (made[i].workspace_bytes) {
      workspace_req[i] = static_cast<int32_t>(reqs.size());
      reqs.push_back({made[i].workspace_bytes, s, s, -1});
    }
  }
  MemoryPlan plan = plan_memory(reqs);
  parts.arena_bytes = plan.arena_bytes;
  parts.arena_blocks = plan.distinct_blocks;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (req_of[i] >= 0) slot_of[i] = {SlotKind::Arena, 0, plan.offsets[req_of[i]]};

  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (step_of[i] < 0) continue;
    const Node& n = g.nodes[i];
    runtime::Step st{n.op, std::move(made[i].run), {}, {slot_of[i]}};
    for (ValueRef v : n.operands) st.in.push_back(slot_of[v.node]);
    if (workspace_req[i] >= 0) st.out.push_back({SlotKind::Arena, 0, plan.offsets[workspace_req[i]]});
    parts.steps.push_back(std::move(st));
  }
  for (int32_t k : copy_out_of) {
    ValueRef v = g.outputs[k];
    const ir::TensorType& t = g.type(v);
    ir::Attrs attrs{t.shape};
    kernels::Kernel copy = kernels::make_kernel({OpKind::Reshape, attrs, {t}, {t}});
    parts.steps.push_back({OpKind::Reshape, std::move(copy.run), {slot_of[v.node]}, {{SlotKind::Output, k, 0}}});
  }
  parts.graph = g;
  return std::make_shared<runtime::Executable>(std::move(parts));
}

std::shared_ptr<runtime::Executable> compile(const Graph& graph, const std::vector<int32_t>& donations) {
  ir::verify(graph);
  Graph optimized = optimize(graph);
  ir::verify(optimized);
  return lower(optimized, donations);
}

}  // namespace lazyrt::compile
