// Elementwise fusion: groups of elementwise nodes with one result shape become one fusion node
// whose region holds them, so that they run as one kernel (fused.cpp) instead of one kernel
// and one intermediate buffer per op. An optimizer update (~20 ops per parameter) becomes one
// step.
//
// Where the backend fuses reductions, a group may also hold reductions over the trailing dims
// of values of its shape, and elementwise nodes over one value per row that use their results
// (its Space; ops.def, fusion): a layer norm, or a bias-add and the sum of its result, become
// one kernel (fused_rows.cpp).
//
// Grouping is greedy in graph order. A node joins the groups of its operands that it shares a
// space with (those whose last member is less than kDistantReader nodes back), merging them,
// when the merged group
//   - stays within the backend's limits (max_fused_ops ops, max_fused_inputs operands),
//   - reads a value per row with the row's dims kept only (so broadcasting means per row),
//   - and no operand from outside the group depends on a member. Only nodes from the group's
//     first member on can, so that search is short.
// Otherwise it joins as many of those groups as pass, taken in operand order (a backward
// node reading a forward group and a backward one joins the backward one), or starts its own.
// Groups of one node stay as they are (unless a constant of more than one element becomes a
// scalar in the region). Two groups can still wait on each other through a
// third node (each depends on the other as a unit); such groups are found afterwards as
// cycles of the graph of groups and undone.
//
// Constants (full) are copied into the regions that read them. Members whose values are read
// outside the group, or are outputs, become the fusion's results. The new graph is ordered
// with fusion nodes and the other nodes as units, each as early as its operands allow after
// the units the old order put before it.
#include <algorithm>
#include <optional>
#include <queue>

#include "compile/passes.h"
#include "util/check.h"

namespace lazyrt::compile {

using ir::Graph;
using ir::Node;
using ir::OpKind;
using ir::ValueRef;

namespace {

bool fusible(const Node& n) {
  return ir::has_flag(n.op, ir::kElementwise) && n.regions.empty() && n.results.size() == 1;
}

// The space a group's nodes share: the shape of its elementwise nodes, and the trailing dims
// its reductions reduce (0: none; ops.def, fusion).
struct Space {
  Shape shape;
  int64_t reduced = 0;
};

// Rows of at least this many elements, or spaces of at most kSmallSpace elements, are worth a
// fused reduction: its kernel makes its passes row by row.
constexpr int64_t kMinFusedRow = 32;
constexpr int64_t kSmallSpace = int64_t{1} << 16;

class Grouping {
 public:
  Grouping(const Graph& g, const backend::Capabilities& caps)
      : g_(g), caps_(caps), group_of_(g.nodes.size(), -1), member_(g.nodes.size(), 0), seen_(g.nodes.size(), 0) {
    for (size_t i = 0; i < g_.nodes.size(); ++i) place(static_cast<int32_t>(i));
  }
  int32_t group_of(size_t node) const { return group_of_[node]; }
  const std::vector<std::vector<int32_t>>& groups() const { return groups_; }
  const Space& space(int32_t group) const { return spaces_[static_cast<size_t>(group)]; }

 private:
  // k > 0: node i is a reduction over its last k dims that a group may hold.
  int64_t reduction_dims(int32_t i) const {
    return caps_.fuses_reductions ? ir::row_reduction_dims(g_, g_.nodes[i]) : 0;
  }

  // Whether node i has a place in a group of space `sp`.
  bool fits(int32_t i, const Space& sp) const {
    const Node& n = g_.nodes[i];
    if (const int64_t k = reduction_dims(i))
      return k == sp.reduced && g_.type(n.operands[0]).shape == sp.shape;
    if (!fusible(n)) return false;
    const Shape& s = n.results[0].shape;
    if (s == sp.shape) return true;
    if (sp.reduced == 0) return false;
    const ir::FusionRows rows = ir::fusion_rows(sp.shape, sp.reduced);
    return s == rows.keep || s == rows.drop;
  }

  // The space of node i with the groups `joined`, if they can share one.
  std::optional<Space> merged_space(const std::vector<int32_t>& joined, int32_t i) const {
    std::optional<Space> sp;
    if (const int64_t k = reduction_dims(i)) sp = Space{g_.type(g_.nodes[i].operands[0]).shape, k};
    for (int32_t gr : joined)
      if (spaces_[gr].reduced > 0 && !sp) sp = spaces_[gr];
    if (!sp) sp = Space{g_.nodes[i].results[0].shape, 0};
    if (!fits(i, *sp)) return std::nullopt;
    for (int32_t gr : joined) {
      if (spaces_[gr].reduced > 0 && (spaces_[gr].reduced != sp->reduced || spaces_[gr].shape != sp->shape))
        return std::nullopt;
      for (int32_t m : groups_[gr])
        if (!fits(m, *sp)) return std::nullopt;
    }
    return sp;
  }

  // A space whose reductions are worth fusing.
  static bool worth_fusing(const Space& sp) {
    if (sp.reduced == 0) return true;
    const int64_t numel = shape_numel(sp.shape);
    return numel <= kSmallSpace || ir::fusion_rows(sp.shape, sp.reduced).row >= kMinFusedRow;
  }

  void place(int32_t i) {
    const Node& n = g_.nodes[i];
    const int64_t k = reduction_dims(i);
    if (k == 0 && !fusible(n)) return;
    std::vector<int32_t> joined;
    for (ValueRef v : n.operands) {
      const int32_t gr = group_of_[v.node];
      // Not a group made long before (a forward group, for a backward node): its results
      // would then include a value made for that distant node and kept until it runs.
      if (gr >= 0 && i - groups_[gr].back() < kDistantReader &&
          std::find(joined.begin(), joined.end(), gr) == joined.end() && merged_space({gr}, i))
        joined.push_back(gr);
    }
    // All of them, else as many as can join, in operand order, else none.
    auto merge = [&](const std::vector<int32_t>& with) -> std::optional<std::pair<std::vector<int32_t>, Space>> {
      std::vector<int32_t> merged{i};
      for (int32_t gr : with) merged.insert(merged.end(), groups_[gr].begin(), groups_[gr].end());
      const std::optional<Space> sp = merged_space(with, i);
      if (sp && worth_fusing(*sp) && acceptable(merged, *sp)) return std::make_pair(std::move(merged), *sp);
      return std::nullopt;
    };
    auto best = joined.empty() ? std::nullopt : merge(joined);
    if (!best && joined.size() > 1) {
      std::vector<int32_t> chosen;
      for (int32_t gr : joined) {
        chosen.push_back(gr);
        if (auto m = merge(chosen)) best = std::move(m);
        else chosen.pop_back();
      }
      joined = std::move(chosen);
    }
    if (best) {
      auto& [merged, sp] = *best;
      std::sort(merged.begin(), merged.end());
      const int32_t into = joined[0];
      for (int32_t gr : joined) groups_[gr].clear();
      for (int32_t m : merged) group_of_[m] = into;
      groups_[into] = std::move(merged);
      spaces_[into] = sp;
      return;
    }
    const Space sp = k ? Space{g_.type(n.operands[0]).shape, k} : Space{n.results[0].shape, 0};
    if (!worth_fusing(sp)) return;
    group_of_[i] = static_cast<int32_t>(groups_.size());
    groups_.push_back({i});
    spaces_.push_back(sp);
  }

  bool acceptable(const std::vector<int32_t>& members, const Space& sp) {
    if (members.size() > static_cast<size_t>(caps_.max_fused_ops)) return false;
    ++epoch_;
    for (int32_t m : members) member_[m] = epoch_;
    // A value per row reaches the elements of its row only with the row's dims kept as 1.
    if (sp.reduced > 0) {
      const Shape drop = ir::fusion_rows(sp.shape, sp.reduced).drop;
      for (int32_t m : members) {
        const Node& n = g_.nodes[m];
        if (reduction_dims(m) || n.results[0].shape != sp.shape) continue;
        for (ValueRef v : n.operands)
          if (member_[v.node] == epoch_ && g_.type(v).shape == drop) return false;
      }
    }
    std::vector<ValueRef> outside;
    for (int32_t m : members)
      for (ValueRef v : g_.nodes[m].operands)
        if (member_[v.node] != epoch_ && g_.nodes[v.node].op != OpKind::Full &&
            std::find(outside.begin(), outside.end(), v) == outside.end())
          outside.push_back(v);
    if (outside.size() > static_cast<size_t>(caps_.max_fused_inputs)) return false;
    // A cycle would run from a member through an outside operand back into the group. Only
    // nodes from the group's first member on can be on it, so the search back from the outside
    // operands stops there; a search that grows too long refuses the merge. Cycles that pass
    // through other groups are left to fuse_elementwise, which undoes the groups on them.
    const int32_t first = *std::min_element(members.begin(), members.end());
    std::vector<int32_t> stack;
    for (ValueRef v : outside)
      if (v.node >= first) stack.push_back(v.node);
    size_t budget = kSearchBudget;
    while (!stack.empty()) {
      const int32_t x = stack.back();
      stack.pop_back();
      if (member_[x] == epoch_) return false;
      if (seen_[x] == epoch_) continue;
      if (budget-- == 0) return false;
      seen_[x] = epoch_;
      for (ValueRef v : g_.nodes[x].operands)
        if (v.node >= first && seen_[v.node] != epoch_) stack.push_back(v.node);
    }
    return true;
  }

  static constexpr size_t kSearchBudget = 4096;

  const Graph& g_;
  const backend::Capabilities& caps_;
  std::vector<int32_t> group_of_;
  std::vector<std::vector<int32_t>> groups_;
  std::vector<Space> spaces_;
  std::vector<uint32_t> member_, seen_;  // epoch marks: in the group checked, visited
  uint32_t epoch_ = 0;
};

// Appends the fusion node of group `members` to rw's graph and maps their values to its
// results. read_outside[i]: node i's value is read outside its group or is an output.
void emit_fusion(GraphRewriter& rw, const std::vector<int32_t>& members, const Space& sp,
                 const std::vector<bool>& read_outside) {
  const Graph& g = rw.source();
  Graph region;
  std::vector<ValueRef> operands;  // outer values, one per region parameter
  std::vector<std::pair<ValueRef, ValueRef>> local;  // outer value -> region value
  auto find = [&](ValueRef outer) -> const ValueRef* {
    for (const auto& [o, l] : local)
      if (o == outer) return &l;
    return nullptr;
  };
  for (int32_t m : members) {
    const Node& n = g.nodes[m];
    std::vector<ValueRef> ops;
    for (ValueRef v : n.operands) {
      if (const ValueRef* l = find(v)) {
        ops.push_back(*l);
        continue;
      }
      const Node& def = g.nodes[v.node];
      ValueRef l;
      if (def.op == OpKind::Full) {
        l = region.add(OpKind::Full, {}, def.attrs);
      } else {
        l = region.add_parameter(g.type(v));
        operands.push_back(v);
      }
      local.emplace_back(v, l);
      ops.push_back(l);
    }
    local.emplace_back(ValueRef{m, 0}, region.add(n.op, std::move(ops), n.attrs));
  }
  Node fusion;
  fusion.op = OpKind::Fusion;
  std::vector<int64_t> dtypes, per_row;
  std::vector<int32_t> results;
  const ir::FusionRows rows = ir::fusion_rows(sp.shape, sp.reduced);
  for (int32_t m : members)
    if (read_outside[m]) {
      const ir::TensorType& t = g.nodes[m].results[0];
      region.outputs.push_back(*find({m, 0}));
      results.push_back(m);
      dtypes.push_back(static_cast<int64_t>(t.dtype));
      per_row.push_back(t.shape == sp.shape ? 0 : t.shape == rows.keep ? 1 : 2);
      fusion.results.push_back(t);
    }
  for (ValueRef v : operands) fusion.operands.push_back(rw.map(v));
  fusion.attrs = {sp.shape, std::move(dtypes), sp.reduced, std::move(per_row)};
  fusion.regions.push_back(std::make_shared<const Graph>(std::move(region)));
  rw.graph().nodes.push_back(std::move(fusion));
  const auto idx = static_cast<int32_t>(rw.graph().nodes.size() - 1);
  for (size_t k = 0; k < results.size(); ++k) rw.set(results[k], 0, {idx, static_cast<int32_t>(k)});
}

// The units of the new graph: each group, and each node in no group; per unit, the units it
// reads.
struct Units {
  std::vector<int32_t> unit_of;                // per node
  std::vector<std::vector<int32_t>> members;   // per unit, sorted
  std::vector<std::vector<int32_t>> deps;      // per unit
};

Units make_units(const Graph& g, const std::vector<std::vector<int32_t>>& groups) {
  Units u;
  u.unit_of.assign(g.nodes.size(), -1);
  for (const auto& members : groups) {
    for (int32_t m : members) u.unit_of[m] = static_cast<int32_t>(u.members.size());
    u.members.push_back(members);
  }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (u.unit_of[i] < 0) {
      u.unit_of[i] = static_cast<int32_t>(u.members.size());
      u.members.push_back({static_cast<int32_t>(i)});
    }
  u.deps.resize(u.members.size());
  for (size_t k = 0; k < u.members.size(); ++k)
    for (int32_t m : u.members[k])
      for (ValueRef v : g.nodes[m].operands) {
        const int32_t d = u.unit_of[v.node];
        if (d != static_cast<int32_t>(k) && std::find(u.deps[k].begin(), u.deps[k].end(), d) == u.deps[k].end())
          u.deps[k].push_back(d);
      }
  return u;
}

// Units on a cycle: the members of strongly connected components of more than one unit
// (Tarjan's algorithm, without recursion).
std::vector<bool> on_cycles(const std::vector<std::vector<int32_t>>& deps) {
  const size_t n = deps.size();
  std::vector<int32_t> index(n, -1), low(n, 0), stack;
  std::vector<bool> on_stack(n, false), cyclic(n, false);
  std::vector<std::pair<int32_t, size_t>> calls;  // (unit, next dependency to look at)
  int32_t counter = 0;
  auto enter = [&](int32_t v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    on_stack[v] = true;
    calls.push_back({v, 0});
  };
  for (size_t s = 0; s < n; ++s) {
    if (index[s] >= 0) continue;
    enter(static_cast<int32_t>(s));
    while (!calls.empty()) {
      const int32_t v = calls.back().first;
      if (calls.back().second < deps[v].size()) {
        const int32_t w = deps[v][calls.back().second++];
        if (index[w] < 0) enter(w);
        else if (on_stack[w]) low[v] = std::min(low[v], index[w]);
        continue;
      }
      if (low[v] == index[v]) {
        size_t size = 0;
        for (size_t k = stack.size(); k-- > 0 && stack[k] != v;) ++size;
        const bool cycle = size > 0;
        int32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = false;
          cyclic[w] = cycle;
        } while (w != v);
      }
      calls.pop_back();
      if (!calls.empty()) low[calls.back().first] = std::min(low[calls.back().first], low[v]);
    }
  }
  return cyclic;
}

}  // namespace

Graph fuse_elementwise(const Graph& g, const backend::Capabilities& caps) {
  if (!caps.fuses()) return g;
  const Grouping grouping(g, caps);
  std::vector<std::vector<int32_t>> groups;
  std::vector<Space> spaces;
  // A group of one elementwise node stays as it is, unless it reads a constant of more than one
  // element: in a region the constant is a scalar, not a buffer filled and read on every run
  // (a relu's gradient, where(mask, 0, g), reads zeros of its whole shape).
  auto reads_filled_constant = [&](int32_t i) {
    if (!fusible(g.nodes[i])) return false;
    for (ValueRef v : g.nodes[i].operands)
      if (g.nodes[v.node].op == OpKind::Full && shape_numel(g.type(v).shape) > 1) return true;
    return false;
  };
  for (size_t k = 0; k < grouping.groups().size(); ++k)
    if (grouping.groups()[k].size() > 1 ||
        (grouping.groups()[k].size() == 1 && reads_filled_constant(grouping.groups()[k][0]))) {
      groups.push_back(grouping.groups()[k]);
      spaces.push_back(grouping.space(static_cast<int32_t>(k)));
    }
  if (groups.empty()) return g;
  Units units = make_units(g, groups);
  // Groups that wait on each other through other groups: undone, their nodes left single.
  // Undoing only these leaves no cycle: one among the rest would have been one before.
  const std::vector<bool> cyclic = on_cycles(units.deps);
  if (std::find(cyclic.begin(), cyclic.begin() + static_cast<std::ptrdiff_t>(groups.size()), true) !=
      cyclic.begin() + static_cast<std::ptrdiff_t>(groups.size())) {
    std::vector<std::vector<int32_t>> kept;
    std::vector<Space> kept_spaces;
    for (size_t k = 0; k < groups.size(); ++k)
      if (!cyclic[k]) {
        kept.push_back(std::move(groups[k]));
        kept_spaces.push_back(std::move(spaces[k]));
      }
    groups = std::move(kept);
    spaces = std::move(kept_spaces);
    if (groups.empty()) return g;
    units = make_units(g, groups);
  }

  std::vector<bool> read_outside(g.nodes.size(), false);
  for (ValueRef v : g.outputs) read_outside[v.node] = true;
  for (size_t k = 0; k < units.members.size(); ++k)
    for (int32_t m : units.members[k])
      for (ValueRef v : g.nodes[m].operands)
        if (units.unit_of[v.node] != static_cast<int32_t>(k)) read_outside[v.node] = true;
  std::vector<std::vector<int32_t>> users(units.members.size());
  std::vector<int32_t> pending(units.members.size(), 0);
  for (size_t k = 0; k < units.members.size(); ++k) {
    for (int32_t d : units.deps[k]) users[d].push_back(static_cast<int32_t>(k));
    pending[k] = static_cast<int32_t>(units.deps[k].size());
  }
  // Ready units, the one the old order reached first (by its last member) first.
  using Entry = std::pair<int32_t, int32_t>;  // (last member, unit)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
  for (size_t k = 0; k < units.members.size(); ++k)
    if (pending[k] == 0) ready.push({units.members[k].back(), static_cast<int32_t>(k)});
  GraphRewriter rw(g);
  size_t emitted = 0;
  while (!ready.empty()) {
    const int32_t k = ready.top().second;
    ready.pop();
    ++emitted;
    if (static_cast<size_t>(k) >= groups.size()) rw.copy(units.members[k][0]);
    else emit_fusion(rw, units.members[k], spaces[static_cast<size_t>(k)], read_outside);
    for (int32_t user : users[k])
      if (--pending[user] == 0) ready.push({units.members[user].back(), user});
  }
  LAZYRT_ASSERT(emitted == units.members.size(), "fusion left a cycle among its groups");
  return rw.finish();
}

}  // namespace lazyrt::compile
