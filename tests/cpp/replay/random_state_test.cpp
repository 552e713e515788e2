// The random generator's state is carried through every compiled step, whatever the step's
// order: also when the step's trace is the process's first use of the generator, which makes
// the generator then (random_ops.cpp). Each case needs a process that has not drawn yet, so it
// runs in a child that gtest starts afresh (the "threadsafe" death-test style re-executes this
// binary for the one case), which exits 0 when every check holds and 1 with a message
// otherwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <lazyrt/lazyrt.h>

namespace lazyrt {
namespace {

[[noreturn]] void finish(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "check failed: %s\n", what);
  std::fflush(stderr);
  std::_Exit(ok ? 0 : 1);
}

int64_t offset_now() { return static_cast<int64_t>(random_state().second.item()); }

// Three calls of `step` on zeros: the generator advances by `per_call` each call, every call
// draws numbers of its own, and the calls draw what the plain program (rand, mark_step) draws
// from the same seed.
[[noreturn]] void check_calls(CompiledStep& step, const Tensor& z, int64_t per_call) {
  std::vector<std::vector<float>> got;
  for (int i = 0; i < 3; ++i) got.push_back(step({z})[0].to_vector<float>());
  if (got[0] == got[1] || got[1] == got[2]) finish(false, "two calls drew the same numbers");
  if (offset_now() != 3 * per_call) finish(false, "the generator's offset did not advance with the calls");
  manual_seed(5);
  std::vector<std::vector<float>> replayed;
  for (int i = 0; i < 2; ++i) replayed.push_back(step({z})[0].to_vector<float>());
  manual_seed(5);
  for (int i = 0; i < 2; ++i) {
    Tensor plain = z + rand({3});
    if (per_call > 3) plain = plain + rand({3});
    mark_step();
    if (plain.to_vector<float>() != replayed[i]) finish(false, "a replay drew other numbers than the plain program");
  }
  finish(true, "");
}

class RandomStateFirstUse : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(RandomStateFirstUse, FirstTraceOfTheProcessCarriesTheGeneratorState) {
  EXPECT_EXIT(
      {
        Tensor z = zeros({3});
        CompiledStep step = compile_step([](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] + rand({3})}; },
                                         {z});
        check_calls(step, z, 3);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(RandomStateFirstUse, FirstDrawInsideALoopBodyOfTheFirstTrace) {
  EXPECT_EXIT(
      {
        Tensor z = zeros({3});
        // Two draws a call: one in a loop body (the generator's first use), one after it.
        CompiledStep step = compile_step(
            [](const std::vector<Tensor>& a) {
              Tensor c = fori_loop(0, 1, [](const Tensor&, const Carry& cc) { return Carry{cc[0] + rand({3})}; }, {a[0]})[0];
              return std::vector<Tensor>{c + rand({3})};
            },
            {z});
        check_calls(step, z, 6);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace lazyrt
