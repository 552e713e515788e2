// Elementwise fusion: groups of elementwise nodes with one result shape become one fusion node
// whose region holds them, so that they run as one kernel (fused.cpp) instead of one kernel
// and one intermediate buffer per op. An optimizer update (~20 ops per parameter) becomes one
// step.
//
// Grouping is greedy in graph order. A node joins the groups of its operands that have its
// result shape, merging them, when the merged group
//   - stays within the backend's limits (max_fused_ops ops, max_fused_inputs operands),
//   - and no operand from outside the group depends on a member. Only nodes from the group's
//     first member on can, so that search is short.
// Otherwise it joins the first of those groups alone if that passes, or starts its own.
// Groups of one node stay as they are. Two groups can still wait on each other through a
// third node (each depends on the other as a unit); such groups are found afterwards as
// cycles of the graph of groups and undone.
//
// Constants (full) are copied into the regions that read them. Members whose values are read
// outside the group, or are outputs, become the fusion's results. The new graph is ordered
// with fusion nodes and the other nodes as units, each as early as its operands allow after
// the units the old order put before it.
#include <algorithm>
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

class Grouping {
 public:
  Grouping(const Graph& g, const backend::Capabilities& caps)
      : g_(g), caps_(caps), group_of_(g.nodes.size(), -1), member_(g.nodes.size(), 0), seen_(g.nodes.size(), 0) {
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      if (fusible(g_.nodes[i])) place(static_cast<int32_t>(i));
  }
  int32_t group_of(size_t node) const { return group_of_[node]; }
  const std::vector<std::vector<int32_t>>& groups() const { return groups_; }

 private:
  void place(int32_t i) {
    const Node& n = g_.nodes[i];
    std::vector<int32_t> joined;
    for (ValueRef v : n.operands) {
      const int32_t gr = group_of_[v.node];
      if (gr >= 0 && g_.nodes[v.node].results[0].shape == n.results[0].shape &&
          std::find(joined.begin(), joined.end(), gr) == joined.end())
        joined.push_back(gr);
    }
    // All of them, else the first alone, else none.
    while (!joined.empty()) {
      std::vector<int32_t> merged{i};
      for (int32_t gr : joined) merged.insert(merged.end(), groups_[gr].begin(), groups_[gr].end());
      if (acceptable(merged)) {
        std::sort(merged.begin(), merged.end());
        const int32_t into = joined[0];
        for (int32_t gr : joined) groups_[gr].clear();
        for (int32_t m : merged) group_of_[m] = into;
        groups_[into] = std::move(merged);
        return;
      }
      if (joined.size() > 1) joined.erase(joined.begin() + 1, joined.end());
      else joined.clear();
    }
    group_of_[i] = static_cast<int32_t>(groups_.size());
    groups_.push_back({i});
  }

  bool acceptable(const std::vector<int32_t>& members) {
    if (members.size() > static_cast<size_t>(caps_.max_fused_ops)) return false;
    ++epoch_;
    for (int32_t m : members) member_[m] = epoch_;
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
  std::vector<uint32_t> member_, seen_;  // epoch marks: in the group checked, visited
  uint32_t epoch_ = 0;
};

// Appends the fusion node of group `members` to rw's graph and maps their values to its
// results. read_outside[i]: node i's value is read outside its group or is an output.
void emit_fusion(GraphRewriter& rw, const std::vector<int32_t>& members,
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
  std::vector<int64_t> dtypes;
  std::vector<int32_t> results;
  for (int32_t m : members)
    if (read_outside[m]) {
      region.outputs.push_back(*find({m, 0}));
      results.push_back(m);
      dtypes.push_back(static_cast<int64_t>(g.nodes[m].results[0].dtype));
      fusion.results.push_back(g.nodes[m].results[0]);
    }
  for (ValueRef v : operands) fusion.operands.push_back(rw.map(v));
  fusion.attrs = {g.nodes[members[0]].results[0].shape, std::move(dtypes)};
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
  for (const auto& members : grouping.groups())
    if (members.size() > 1) groups.push_back(members);
  if (groups.empty()) return g;
  Units units = make_units(g, groups);
  // Groups that wait on each other through other groups: undone, their nodes left single.
  // Undoing only these leaves no cycle: one among the rest would have been one before.
  const std::vector<bool> cyclic = on_cycles(units.deps);
  if (std::find(cyclic.begin(), cyclic.begin() + static_cast<std::ptrdiff_t>(groups.size()), true) !=
      cyclic.begin() + static_cast<std::ptrdiff_t>(groups.size())) {
    std::vector<std::vector<int32_t>> kept;
    for (size_t k = 0; k < groups.size(); ++k)
      if (!cyclic[k]) kept.push_back(std::move(groups[k]));
    groups = std::move(kept);
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
    if (units.members[k].size() == 1) rw.copy(units.members[k][0]);
    else emit_fusion(rw, units.members[k], read_outside);
    for (int32_t user : users[k])
      if (--pending[user] == 0) ready.push({units.members[user].back(), user});
  }
  LAZYRT_ASSERT(emitted == units.members.size(), "fusion left a cycle among its groups");
  return rw.finish();
}

}  // namespace lazyrt::compile
