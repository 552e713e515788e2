#include <gtest/gtest.h>

#include <set>
#include <string>

#include "ir/op.h"

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

}  // namespace lazyrt::ir
