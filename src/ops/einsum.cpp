// einsum as torch.einsum: the equation is parsed into labels per operand, a label repeated
// within one operand takes that operand's diagonal, labels no later term needs are summed out
// early, and the operands are contracted pairwise from the left, each pair as one batched
// matmul ([batch, left, contracted] x [batch, contracted, right]). Broadcast dims ("...")
// and size-1 dims broadcast as in torch; 16-bit operands compute in f32, rounded once. Every argument is checked before the first node is
// recorded.
#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lazyrt/tensor.h"
#include "ops/op_helpers.h"
#include "util/check.h"

namespace lazyrt {

using detail::impl_of;

namespace {

// Letters are labels 0..51 (upper case first: the implicit output's order, as torch's); the dims "..." stands for are labels 52.. counted from the right,
// so that broadcast dims of different operands line up as in broadcasting.
constexpr int kEllipsisBase = 52;

std::string label_name(int l) {
  if (l >= kEllipsisBase) return "of \"...\"";
  return std::string(1, static_cast<char>(l < 26 ? 'A' + l : 'a' + (l - 26)));
}

int letter_label(char c, std::string_view eq) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return 26 + (c - 'a');
  throw Error(detail::str_cat("einsum: invalid subscript '", std::string(1, c), "' in \"", eq,
                      "\" (letters a-z and A-Z only)"));
}

struct Term {
  std::vector<int> letters;  // labels in order, -1 where "..." stands
  bool ellipsis = false;
};

Term parse_term(std::string_view t, std::string_view eq) {
  Term term;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == ' ') continue;
    if (t[i] == '.') {
      LAZYRT_CHECK(t.substr(i, 3) == "..." && !term.ellipsis, "einsum: invalid use of '.' in \"", eq,
                   "\" (one \"...\" per term)");
      term.ellipsis = true;
      term.letters.push_back(-1);
      i += 2;
      continue;
    }
    term.letters.push_back(letter_label(t[i], eq));
  }
  return term;
}

// A tensor with one label per dim.
struct Labeled {
  Tensor t;
  std::vector<int> labels;
};

// The labels of a term for an operand of `rank` dims.
std::vector<int> expand_term(const Term& term, int64_t ellipsis_dims) {
  std::vector<int> out;
  for (int l : term.letters) {
    if (l >= 0) {
      out.push_back(l);
      continue;
    }
    for (int64_t k = ellipsis_dims; k-- > 0;) out.push_back(kEllipsisBase + static_cast<int>(k));
  }
  return out;
}

// The diagonal of dims i < j (of one size n): moved last, merged to n * n, every (n + 1)-th.
Tensor diagonal_of(const Tensor& t, int64_t i, int64_t j) {
  std::vector<int64_t> order;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != i && d != j) order.push_back(d);
  order.push_back(i);
  order.push_back(j);
  Tensor p = permute(t, order);
  Shape s(p.shape().begin(), p.shape().end() - 2);
  const int64_t n = t.shape()[i];
  s.push_back(n * n);
  Tensor flat = reshape(p, s);
  Tensor diag = slice(flat, -1, 0, n * n, n + 1);
  // The diagonal's dim goes where i was (its label stays at i's position).
  std::vector<int64_t> back;
  for (int64_t d = 0, k = 0; d < t.dim(); ++d) {
    if (d == j) continue;
    back.push_back(d == i ? diag.dim() - 1 : k++);
  }
  return permute(diag, back);
}

// Sums the dims whose labels `keep` rejects.
Labeled sum_out(Labeled x, const std::vector<bool>& keep) {
  std::vector<int64_t> dims;
  std::vector<int> labels;
  for (size_t d = 0; d < x.labels.size(); ++d) {
    if (keep[x.labels[d]]) labels.push_back(x.labels[d]);
    else dims.push_back(static_cast<int64_t>(d));
  }
  if (dims.empty()) return x;
  return {sum(x.t, dims), labels};
}

int64_t size_of(const Labeled& x, int label) {
  auto it = std::find(x.labels.begin(), x.labels.end(), label);
  return it == x.labels.end() ? 1 : x.t.shape()[it - x.labels.begin()];
}

// x permuted to `order` (labels it lacks become size-1 dims), then merged into the groups
// given by their sizes.
Tensor arrange(const Labeled& x, const std::vector<std::vector<int>>& groups,
               const std::vector<int64_t>& sizes_of_label) {
  std::vector<int64_t> perm;
  Shape with_ones;
  for (const auto& g : groups)
    for (int l : g) {
      auto it = std::find(x.labels.begin(), x.labels.end(), l);
      if (it != x.labels.end()) perm.push_back(it - x.labels.begin());
    }
  Tensor p = permute(x.t, perm);
  Shape expanded, merged;
  for (const auto& g : groups) {
    int64_t m = 1;
    for (int l : g) {
      const bool has = std::find(x.labels.begin(), x.labels.end(), l) != x.labels.end();
      with_ones.push_back(has ? size_of(x, l) : 1);
      expanded.push_back(sizes_of_label[l]);
      m *= sizes_of_label[l];
    }
    merged.push_back(m);
  }
  return reshape(expand(reshape(p, with_ones), expanded), merged);
}

}  // namespace

Tensor einsum(std::string_view eq, const std::vector<Tensor>& operands) {
  for (const Tensor& t : operands) impl_of(t, "einsum");
  const size_t arrow = eq.find("->");
  const std::string_view lhs = eq.substr(0, arrow);
  std::vector<Term> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(parse_term(lhs.substr(start, comma == std::string_view::npos ? comma : comma - start), eq));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  LAZYRT_CHECK(terms.size() == operands.size(), "einsum: \"", eq, "\" has ", terms.size(),
               " operand terms but ", operands.size(), " operands were given");

  // Labels per operand, with "..." expanded; the broadcast rank is the largest.
  std::vector<Labeled> xs;
  int64_t ellipsis_rank = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const int64_t named = static_cast<int64_t>(terms[i].letters.size()) - (terms[i].ellipsis ? 1 : 0);
    const int64_t rank = operands[i].dim();
    LAZYRT_CHECK(terms[i].ellipsis ? rank >= named : rank == named, "einsum: operand ", i, " is ",
                 dtype_name(operands[i].dtype()), shape_str(operands[i].shape()), " but its subscripts in \"",
                 eq, "\" name ", named, terms[i].ellipsis ? " dims and \"...\"" : " dims");
    ellipsis_rank = std::max(ellipsis_rank, terms[i].ellipsis ? rank - named : 0);
    // 16-bit operands compute in f32 and round once at the end (opmath_type).
    xs.push_back({detail::cast_to(operands[i], detail::opmath_type(operands[i].dtype())), expand_term(terms[i], terms[i].ellipsis ? rank - named : 0)});
  }
  LAZYRT_CHECK(!operands.empty(), "einsum: expects at least one operand");
  const DType dtype = operands[0].dtype();
  for (const Tensor& t : operands)
    LAZYRT_CHECK(t.dtype() == dtype, "einsum: expects operands of one dtype, got ", dtype_name(dtype), " and ",
                 dtype_name(t.dtype()));

  // The output's labels: given, or "..." then the letters used once, in alphabetical order.
  std::vector<int> out;
  const int num_labels = kEllipsisBase + static_cast<int>(ellipsis_rank);
  std::vector<int> count(num_labels, 0);
  for (const auto& x : xs)
    for (int l : x.labels) ++count[l];
  if (arrow != std::string_view::npos) {
    Term t = parse_term(eq.substr(arrow + 2), eq);
    for (int l : t.letters) {
      if (l < 0) {
        for (int64_t k = ellipsis_rank; k-- > 0;) out.push_back(kEllipsisBase + static_cast<int>(k));
        continue;
      }
      LAZYRT_CHECK(count[l] > 0, "einsum: output subscript ", label_name(l), " of \"", eq,
                   "\" appears in no operand");
      LAZYRT_CHECK(std::count(out.begin(), out.end(), l) == 0, "einsum: output subscript ", label_name(l),
                   " repeated in \"", eq, "\"");
      out.push_back(l);
    }
  } else {
    for (int64_t k = ellipsis_rank; k-- > 0;) out.push_back(kEllipsisBase + static_cast<int>(k));
    for (int l = 0; l < kEllipsisBase; ++l)
      if (count[l] == 1) out.push_back(l);
  }

  // Sizes per label: equal, or 1 (broadcast).
  std::vector<int64_t> size(num_labels, 1);
  for (size_t i = 0; i < xs.size(); ++i)
    for (size_t d = 0; d < xs[i].labels.size(); ++d) {
      const int l = xs[i].labels[d];
      const int64_t n = xs[i].t.shape()[d];
      LAZYRT_CHECK(n == size[l] || n == 1 || size[l] == 1, "einsum: subscript ", label_name(l), " has size ", n, " in operand ", i, " but ", size[l], " elsewhere, in \"", eq, "\"");
      if (n != 1) size[l] = n;
    }

  // Diagonals of labels repeated within an operand.
  for (auto& x : xs) {
    for (size_t i = 0; i < x.labels.size(); ++i)
      for (size_t j = x.labels.size(); j-- > i + 1;) {
        if (x.labels[j] != x.labels[i]) continue;
        LAZYRT_CHECK(x.t.shape()[i] == x.t.shape()[j], "einsum: subscript repeated in one operand of \"", eq,
                     "\" on dims of sizes ", x.t.shape()[i], " and ", x.t.shape()[j]);
        x.t = diagonal_of(x.t, static_cast<int64_t>(i), static_cast<int64_t>(j));
        x.labels.erase(x.labels.begin() + static_cast<std::ptrdiff_t>(j));
      }
  }

  // Which labels are still needed after operand i: by the output or by a later operand.
  auto needed_after = [&](size_t i) {
    std::vector<bool> keep(num_labels, false);
    for (int l : out) keep[l] = true;
    for (size_t k = i + 1; k < xs.size(); ++k)
      for (int l : xs[k].labels) keep[l] = true;
    return keep;
  };

  Labeled acc = sum_out(xs[0], needed_after(0));
  for (size_t i = 1; i < xs.size(); ++i) {
    const std::vector<bool> keep = needed_after(i);
    // Labels only the right operand has, and nobody needs later, are summed out first.
    std::vector<bool> keep_right = keep;
    for (int l : acc.labels) keep_right[l] = true;
    Labeled rhs = sum_out(xs[i], keep_right);
    auto has = [](const Labeled& x, int l) { return std::find(x.labels.begin(), x.labels.end(), l) != x.labels.end(); };
    std::vector<int> batch, left, contracted, right;
    for (int l : acc.labels) {
      if (has(rhs, l)) (keep[l] ? batch : contracted).push_back(l);
      else left.push_back(l);
    }
    for (int l : rhs.labels)
      if (!has(acc, l)) right.push_back(l);
    // acc holds only labels still needed, so its own labels are needed here or later.
    Tensor a = arrange(acc, {batch, left, contracted}, size);
    Tensor b = arrange(rhs, {batch, contracted, right}, size);
    Tensor prod = matmul(a, b);  // [batch, left, right]
    Shape shape;
    std::vector<int> labels;
    for (const auto* g : {&batch, &left, &right})
      for (int l : *g) {
        shape.push_back(size[l]);
        labels.push_back(l);
      }
    acc = {reshape(prod, shape), labels};
  }

  // Broadcast a single operand's size-1 dims where another operand set the size, then order.
  std::vector<int64_t> perm;
  for (int l : out) {
    auto it = std::find(acc.labels.begin(), acc.labels.end(), l);
    perm.push_back(it - acc.labels.begin());
  }
  Tensor r = perm.empty() ? acc.t : permute(acc.t, perm);
  Shape final_shape;
  for (int l : out) final_shape.push_back(size[l]);
  if (r.shape() != final_shape) r = expand(r, final_shape);
  // 16-bit operands computed in f32 round once here; integer results keep the dtype the ops
  // gave (a summed label gives i64, as torch's sum does in its einsum).
  return detail::opmath_type(dtype) != dtype ? detail::cast_to(r, dtype) : r;
}

}  // namespace lazyrt
