#include <gtest/gtest.h>

#include <set>
#include <string>

#include "ir/graph.h"
#include "ir/op.h"
#include "lazyrt/types.h"

namespace lazyrt::ir {

TEST(OpTable, EveryOpHasAUniqueNameThatMapsBack) {
  std::set<std::string> names;
  for (int i = 0; i < kNumOps; ++i) {
    auto op = static_cast<OpKind>(i);
    std::string name(op_name(op));
    EXPECT_FALSE(name.empty()) << "op " << i;
    EXPECT_TRUE(names.insert(name).second) << "duplicate op name " << name;
    OpKind back;
    ASSERT_TRUE(op_from_name(name, &back)) << name;
    EXPECT_EQ(back, op);
  }
  OpKind unused;
  EXPECT_FALSE(op_from_name("no_such_op", &unused));
}

TEST(OpTable, AttributeSpecsAreParsedInOrder) {
  const OpInfo& sum = op_info(OpKind::Sum);
  ASSERT_EQ(sum.attrs.size(), 2u);
  EXPECT_EQ(sum.attrs[0].name, "dims");
  EXPECT_EQ(sum.attrs[0].kind, AttrKind::Ints);
  EXPECT_EQ(sum.attrs[1].name, "keepdim");
  EXPECT_EQ(sum.attrs[1].kind, AttrKind::Bool);
  EXPECT_EQ(op_info(OpKind::Full).attrs.size(), 3u);
  EXPECT_TRUE(op_info(OpKind::Neg).attrs.empty());
}

TEST(OpTable, FlagsMatchTheOpsMeaning) {
  EXPECT_TRUE(has_flag(OpKind::Add, kCommutative));
  EXPECT_FALSE(has_flag(OpKind::Sub, kCommutative));
  EXPECT_TRUE(has_flag(OpKind::Exp, kElementwise));
  EXPECT_FALSE(has_flag(OpKind::Sum, kElementwise));
  EXPECT_FALSE(has_flag(OpKind::Matmul, kInPlace));
}

// Attribute reads go through NodeAttrs by the names ops.def declares; the positional
// accessors are gone (a read like `attrs.b(4)` no longer compiles).
TEST(OpTable, NodeAttrsReadsByName) {
  // kernel stride padding ceil_mode count_include_pad divisor
  const Attrs pool{std::vector<int64_t>{3, 2}, std::vector<int64_t>{2, 1},
                   std::vector<int64_t>{1, 0}, true, false, int64_t{5}};
  const NodeAttrs a(OpKind::AvgPool2d, pool);
  EXPECT_EQ(a.ints<"kernel">(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a.ints<"stride">(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(a.ints<"padding">(), (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(a.b<"ceil_mode">());
  EXPECT_FALSE(a.b<"count_include_pad">());
  EXPECT_EQ(a.i<"divisor">(), 5);

  // The backward op has input_size first: the same names sit one place later.
  const Attrs back{std::vector<int64_t>{1, 1, 8, 8}, std::vector<int64_t>{3, 2},
                   std::vector<int64_t>{2, 1}, std::vector<int64_t>{1, 0}, false, true,
                   int64_t{0}};
  const NodeAttrs b(OpKind::AvgPool2dBackward, back);
  EXPECT_EQ(b.ints<"input_size">(), (std::vector<int64_t>{1, 1, 8, 8}));
  EXPECT_EQ(b.ints<"kernel">(), (std::vector<int64_t>{3, 2}));
  EXPECT_FALSE(b.b<"ceil_mode">());
  EXPECT_TRUE(b.b<"count_include_pad">());
  EXPECT_EQ(b.i<"divisor">(), 0);

  const Attrs full{2.5, std::vector<int64_t>{2, 3}, DType::f64};
  const NodeAttrs f(OpKind::Full, full);
  EXPECT_EQ(f.f<"value">(), 2.5);
  EXPECT_EQ(f.ints<"shape">(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.dtype<"dtype">(), DType::f64);

  const Attrs var{std::vector<int64_t>{0, 2}, true, 1.0};
  const NodeAttrs v(OpKind::Var, var);
  EXPECT_EQ(v.ints<"dims">(), (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(v.b<"keepdim">());
  EXPECT_EQ(v.f<"correction">(), 1.0);

  const Attrs param{int64_t{7}};
  EXPECT_EQ(NodeAttrs(OpKind::Parameter, param).i<"index">(), 7);
}

// Reading an attribute the op does not have is a bug in lazyrt: LAZYRT_ASSERT throws
// lazyrt::Error ("lazyrt internal error: ...").
TEST(OpTable, NodeAttrsRejectsAttributesTheOpLacks) {
  const Attrs pool{std::vector<int64_t>{2, 2}, std::vector<int64_t>{2, 2},
                   std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1}, false};
  const NodeAttrs max_pool(OpKind::MaxPool2d, pool);
  EXPECT_EQ(max_pool.ints<"dilation">(), (std::vector<int64_t>{1, 1}));
  // max_pool2d has no count_include_pad (avg_pool2d does, so the read compiles).
  EXPECT_THROW(max_pool.b<"count_include_pad">(), Error);
  try {
    (void)max_pool.i<"divisor">();
    ADD_FAILURE() << "reading divisor of max_pool2d did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_pool2d has no attribute divisor"), std::string::npos)
        << e.what();
  }
  // An op without attributes.
  const Attrs none;
  EXPECT_THROW(NodeAttrs(OpKind::Neg, none).ints<"dims">(), Error);
  // A reduction has dims, not the arg reductions' dim.
  const Attrs sum{std::vector<int64_t>{0}, false};
  EXPECT_THROW(NodeAttrs(OpKind::Sum, sum).i<"dim">(), Error);
}

// Names are checked against ops.def at compile time.
static_assert(attr_specs::declared("count_include_pad", AttrKind::Bool));
static_assert(attr_specs::declared("dims", AttrKind::Ints));
static_assert(!attr_specs::declared("count_include_pad", AttrKind::Int));
static_assert(!attr_specs::declared("no_such_attribute", AttrKind::Int));

}  // namespace lazyrt::ir
