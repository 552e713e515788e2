#include "backend/cpu/lower.h"

#include <algorithm>
#include <map>

#include "backend/cpu/control_flow.h"
#include "ir/hash.h"
#include "backend/memory_plan.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cpu/jit/jit.h"
#include "util/check.h"
#include "util/dtype_dispatch.h"

namespace lazyrt::backend::cpu {

using backend::BufferRequest;
using backend::MemoryPlan;
using backend::plan_memory;

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
  const ir::TensorType& in = g.type(node.operands[k]);
  // A fused kernel stores a block's results after reading its operands (fused.cpp).
  if (node.op == OpKind::Fusion) return in.shape == node.results[0].shape;
  // all_reduce and broadcast reduce (or receive) into their result; their kernel skips the
  // copy of the operand when the result is the operand's buffer (a gradient bucket that dies
  // there). Result 1 is the ordering token, a slot of its own.
  if (node.op == OpKind::AllReduce || node.op == OpKind::Broadcast) return k == 0 && in == node.results[0];
  if (!ir::has_flag(node.op, ir::kInPlace) || node.results.size() != 1) return false;
  if (ir::has_flag(node.op, ir::kElementwise)) return in == node.results[0];
  // Other in-place kernels (scatter, index_add) still read their other operands while they
  // write: none of those may be the operand written over.
  for (size_t j = 1; j < node.operands.size(); ++j)
    if (node.operands[j] == node.operands[0]) return false;
  return k == 0 && in.bytes() == node.results[0].bytes();
}

// The operand an indexing node reads its index from (checked against operand 0's `dim`), or
// -1 for any other op.
int index_operand(OpKind op) {
  switch (op) {
    case OpKind::IndexSelect:
    case OpKind::Gather:
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
    case OpKind::IndexAdd: return 1;
    default: return -1;
  }
}

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// The index of a parameter node; the value of a full node.
int64_t param_index(const Node& n) { return ir::NodeAttrs(n.op, n.attrs).i<"index">(); }
double full_value(const Node& n) { return ir::NodeAttrs(n.op, n.attrs).f<"value">(); }

// Full nodes up to this size are constants of the executable, filled once when it is made;
// larger ones are steps that fill their buffer when the graph runs, so that an executable (and
// the cache holding it) never keeps a large constant, and a constant no run needs is never made.
constexpr size_t kMaxBakedConstantBytes = size_t{1} << 16;
bool baked_constant(const Node& n) {
  return n.op == OpKind::Full && n.results[0].bytes() <= kMaxBakedConstantBytes;
}

}  // namespace

std::shared_ptr<runtime::Executable> lower(const Graph& g, const std::vector<int32_t>& donations_in,
                                           const RegionExecutables& regions, const Backend& backend) {
  const size_t num_outputs = g.outputs.size();
  std::vector<int32_t> donations = donations_in;
  donations.resize(num_outputs, -1);

  runtime::Executable::Parts parts;
  parts.param_types.resize(static_cast<size_t>(g.num_params));
  for (const Node& n : g.nodes)
    if (n.op == OpKind::Parameter) parts.param_types[param_index(n)] = n.results[0];
  for (ValueRef v : g.outputs) parts.output_types.push_back(g.type(v));

  // Constants: filled once, here.
  size_t const_bytes = 0;
  std::vector<size_t> const_offset(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (baked_constant(g.nodes[i])) {
      const_offset[i] = const_bytes;
      const_bytes = detail::bytes_add(const_bytes, align64(g.nodes[i].results[0].bytes()), "constants");
    }
  if (const_bytes) {
    parts.constants = backend.allocate(const_bytes);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (baked_constant(g.nodes[i])) {
        const Node& n = g.nodes[i];
        fill_elements(static_cast<char*>(parts.constants->data()) + const_offset[i],
                      n.results[0].dtype, full_value(n), n.results[0].numel());
      }
  }

  // Steps in graph order; the last reader of every value; the readers of every parameter.
  std::vector<int32_t> step_of(g.nodes.size(), -1);
  int32_t num_steps = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].op != OpKind::Parameter && !baked_constant(g.nodes[i])) step_of[i] = num_steps++;
  }
  std::map<ValueRef, int32_t> last_read;
  std::vector<std::vector<int32_t>> param_readers(static_cast<size_t>(g.num_params));
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (step_of[i] < 0) continue;
    for (ValueRef v : g.nodes[i].operands) {
      auto [it, fresh] = last_read.emplace(v, step_of[i]);
      if (!fresh) it->second = std::max(it->second, step_of[i]);
      if (g.nodes[v.node].op == OpKind::Parameter)
        param_readers[param_index(g.nodes[v.node])].push_back(static_cast<int32_t>(i));
    }
  }

  // A failed run changes nothing. A step that may throw on the values it meets (ir::may_fail)
  // runs before any output is written. An indexing node has its index checked by a step of
  // its own: ahead of all others where the index is a parameter of the graph (or a constant),
  // else right after the step that computes the index (a cross-entropy's labels reshaped:
  // early, while the indexing node itself may come late); the node then fails where that check
  // runs. Every output produced at or before the last place a run may fail is computed aside
  // and copied in at the end. One exception (last_collective_result below): the result of the
  // last such step when it is a collective.
  std::vector<int32_t> checked_ahead;
  std::vector<std::pair<int32_t, int32_t>> checked_after;  // (indexing node, step computing its index)
  int32_t last_failing = -1;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (step_of[i] < 0 || !ir::may_fail(g.nodes[i])) continue;
    const Node& n = g.nodes[i];
    const int idx = index_operand(n.op);
    if (idx < 0) {
      last_failing = std::max(last_failing, step_of[i]);
      continue;
    }
    const int32_t producer = step_of[n.operands[static_cast<size_t>(idx)].node];
    if (producer < 0) {
      checked_ahead.push_back(static_cast<int32_t>(i));
    } else {
      checked_after.emplace_back(static_cast<int32_t>(i), producer);
      last_failing = std::max(last_failing, producer);
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
    if (n.op == OpKind::Parameter) param_returned[param_index(n)] = true;
  }
  // The result of a collective that is the last step that may fail is written straight into
  // its output: the tensor that collective updates (`t.copy_(all_reduce(t))`, a gradient
  // reduced in place: a donated parameter's buffer, reduced there by Gloo's in-place ring) or
  // the new tensor it makes, instead of aside and copied back whole. Nothing visible is written
  // before it (every other output at or before it is still computed aside, and the outputs
  // after it, parameters updated from the reduced values among them, run only once it
  // succeeded); if it fails, the tensor receiving its result holds a partial one, as after a
  // failed torch.distributed.all_reduce, and every other output is unchanged.
  auto last_collective_result = [&](ValueRef v) {
    return ir::has_flag(g.nodes[v.node].op, ir::kCollective) && v.index == 0 && step_of[v.node] == last_failing;
  };
  for (size_t k = 0; k < num_outputs; ++k) {
    ValueRef v = g.outputs[k];
    const Node& n = g.node(v);
    if (n.op == OpKind::Parameter) {
      parts.outputs[k] = {OutputSource::Kind::Param, static_cast<int32_t>(param_index(n))};
    } else if (baked_constant(n)) {
      auto buf = backend.allocate(n.results[0].bytes());
      fill_elements(buf->data(), n.results[0].dtype, full_value(n), n.results[0].numel());
      parts.outputs[k] = {OutputSource::Kind::Const, static_cast<int32_t>(parts.constant_outputs.size())};
      parts.constant_outputs.push_back(std::move(buf));
    } else if (auto it = claimed.find(v); it != claimed.end()) {
      parts.outputs[k] = {OutputSource::Kind::Alias, it->second};
    } else {
      parts.outputs[k] = {OutputSource::Kind::Computed, 0};
      claimed[v] = static_cast<int32_t>(k);
      const int32_t p = donations[k];
      const bool aside = step_of[v.node] <= last_failing && !last_collective_result(v);
      if (aside) copy_out_of.push_back(static_cast<int32_t>(k));
      if (p >= 0 && !param_returned[p]) {
        parts.donation_accepted[k] = true;
        if (aside) continue;
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
                param_index(g.node(rn.operands[o])) == p && !can_alias(g, rn, o))
              direct = false;
        }
        if (!direct) copy_out_of.push_back(static_cast<int32_t>(k));
      }
    }
  }
  std::vector<int32_t> copy_step_of_output(num_outputs, -1);
  for (size_t c = 0; c < copy_out_of.size(); ++c)
    copy_step_of_output[copy_out_of[c]] = num_steps + static_cast<int32_t>(c);

  // Kernels, and arena requests for every step result not written straight to an output and
  // for workspaces.
  std::vector<BufferRequest> reqs;
  std::map<ValueRef, int32_t> req_of;
  std::map<ValueRef, Slot> slot_of;
  std::vector<kernels::Kernel> made(g.nodes.size());
  // The graph's generated kernels: its fusion regions, compiled as one module (jit/jit.h).
  const std::shared_ptr<jit::Module> generated = backend.capabilities().fuses() ? jit::new_module() : nullptr;
  std::vector<int32_t> workspace_req(g.nodes.size(), -1);
  std::map<ValueRef, ValueRef> alias_of;  // reshapes read in place: value -> the arena value it reads
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const auto node = static_cast<int32_t>(i);
    if (n.op == OpKind::Parameter) {
      slot_of[{node, 0}] = {SlotKind::Param, static_cast<int32_t>(param_index(n)), 0};
      continue;
    }
    if (baked_constant(n)) {
      slot_of[{node, 0}] = {SlotKind::Const, 0, const_offset[i]};
      continue;
    }
    // A reshape of a value in the arena that is not an output itself is that value's memory
    // read with another shape: no step and no buffer of its own; the value lives as long as
    // the reshape is read (a softmax's probabilities reshaped for a batched product, both
    // read again by the backward, are one buffer, not two).
    if (n.op == OpKind::Reshape && !claimed.count({node, 0})) {
      auto root = alias_of.find(n.operands[0]);
      auto src = root != alias_of.end() ? req_of.find(root->second) : req_of.find(n.operands[0]);
      if (src != req_of.end()) {
        const ValueRef v{node, 0};
        alias_of[v] = src->first;
        auto lr = last_read.find(v);
        if (lr != last_read.end()) reqs[src->second].last = std::max(reqs[src->second].last, lr->second);
        continue;
      }
    }
    std::vector<ir::TensorType> in_types;
    for (ValueRef v : n.operands) in_types.push_back(g.type(v));
    made[i] = n.regions.empty() ? kernels::make_kernel({n.op, n.attrs, in_types, n.results, backend.capabilities().library_kernels})
                                : lower_control_flow(n, in_types, i < regions.size() ? regions[i] : RegionExecutables::value_type{},
                                                     backend, generated);
    const int32_t s = step_of[i];
    for (size_t r = 0; r < n.results.size(); ++r) {
      const ValueRef v{node, static_cast<int32_t>(r)};
      auto it = claimed.find(v);
      if (it != claimed.end() && copy_step_of_output[it->second] < 0) {
        slot_of[v] = {SlotKind::Output, it->second, 0};
        continue;
      }
      BufferRequest req;
      req.bytes = n.results[r].bytes();
      req.first = s;
      auto lr = last_read.find(v);
      req.last = std::max(s, lr == last_read.end() ? s : lr->second);
      if (it != claimed.end()) req.last = copy_step_of_output[it->second];
      if (r == 0 && !n.operands.empty() && can_alias(g, n, 0) &&
          g.type(n.operands[0]).bytes() == n.results[0].bytes()) {
        // Operand 0 read directly or through reshapes: its memory, unless another operand
        // reads that memory too (through a reshape, element by element in another order).
        auto root = [&](ValueRef x) {
          auto a = alias_of.find(x);
          return a == alias_of.end() ? x : a->second;
        };
        const ValueRef mem = root(n.operands[0]);
        bool shared = false;
        for (size_t o = 1; o < n.operands.size(); ++o) shared |= root(n.operands[o]) == mem;
        auto src = req_of.find(mem);
        if (src != req_of.end() && reqs[src->second].last == s && !shared) req.inplace_of = src->second;
      }
      req_of[v] = static_cast<int32_t>(reqs.size());
      reqs.push_back(req);
    }
    // Region kernels always find their workspace after their results, even an empty one.
    if (made[i].workspace_bytes || !n.regions.empty()) {
      workspace_req[i] = static_cast<int32_t>(reqs.size());
      reqs.push_back({made[i].workspace_bytes, s, s, -1});
    }
  }
  jit::Module::finish(generated);
  MemoryPlan plan = plan_memory(reqs);
  parts.arena_bytes = plan.arena_bytes;
  parts.arena = backend.allocate(plan.arena_bytes);
  parts.arena_blocks = plan.distinct_blocks;
  for (const auto& [v, r] : req_of) slot_of[v] = {SlotKind::Arena, 0, plan.offsets[r]};
  for (const auto& [v, root] : alias_of) slot_of[v] = slot_of.at(root);

  // The index check of indexing node i, reading the index's slot (live from the step that
  // computes it to the indexing node's).
  auto index_check = [&](int32_t i) -> runtime::Step {
    const Node& n = g.nodes[static_cast<size_t>(i)];
    std::vector<ir::TensorType> in_types;
    for (ValueRef v : n.operands) in_types.push_back(g.type(v));
    const ValueRef index = n.operands[static_cast<size_t>(index_operand(n.op))];
    return {n.op, kernels::make_index_check({n.op, n.attrs, in_types, n.results}), {slot_of.at(index)}, {}};
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (step_of[i] < 0) continue;
    const Node& n = g.nodes[i];
    if (!alias_of.count({static_cast<int32_t>(i), 0})) {
      runtime::Step st{n.op, std::move(made[i].run), {}, {}};
      const bool repeats = (n.regions.empty() || n.op == OpKind::Fusion) && !ir::has_flag(n.op, ir::kCollective);
      for (ValueRef v : n.operands) {
        st.in.push_back(slot_of.at(v));
        st.bytes += static_cast<int64_t>(g.type(v).bytes());
        if (repeats) st.repeat_sizes.push_back(g.type(v).bytes());
      }
      for (size_t r = 0; r < n.results.size(); ++r) {
        st.out.push_back(slot_of.at({static_cast<int32_t>(i), static_cast<int32_t>(r)}));
        st.bytes += static_cast<int64_t>(n.results[r].bytes());
        if (repeats) st.repeat_sizes.push_back(n.results[r].bytes());
      }
      if (workspace_req[i] >= 0) {
        st.out.push_back({SlotKind::Arena, 0, plan.offsets[workspace_req[i]]});
        if (repeats) st.repeat_sizes.push_back(0);
      }
      parts.steps.push_back(std::move(st));
    }
    for (const auto& [node, producer] : checked_after)
      if (producer == step_of[i]) parts.steps.push_back(index_check(node));
  }
  std::vector<runtime::Step> checks;
  for (int32_t i : checked_ahead) checks.push_back(index_check(i));
  parts.steps.insert(parts.steps.begin(), std::make_move_iterator(checks.begin()), std::make_move_iterator(checks.end()));
  for (int32_t k : copy_out_of) {
    ValueRef v = g.outputs[k];
    const ir::TensorType& t = g.type(v);
    ir::Attrs attrs{t.shape};
    kernels::Kernel copy = kernels::make_kernel({OpKind::Reshape, attrs, {t}, {t}});
    parts.steps.push_back({OpKind::Reshape, std::move(copy.run), {slot_of.at(v)}, {{SlotKind::Output, k, 0}}});
  }
  parts.graph = g;
  return std::make_shared<runtime::Executable>(std::move(parts));
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
  std::shared_ptr<runtime::Executable> lower(const ir::Graph& optimized, const std::vector<int32_t>& donations,
                                             const RegionExecutables& regions) const override {
    return cpu::lower(optimized, donations, regions, *this);
  }

 private:
  std::string name_;
  Capabilities caps_;
  uint64_t fingerprint_ = 0;
};


}  // namespace

const Backend* make_backend(std::string name, Capabilities caps) { return new CpuBackend(std::move(name), caps); }

}  // namespace lazyrt::backend::cpu
