// One kernel maker per row of ops.def. A row without a maker is a link error.
#pragma once

#include "kernels/cpu/kernel.h"

namespace lazyrt::kernels {

#define OP(Enum, name, operands, rule, flags, attrs) Kernel make_##Enum(const KernelSpec& spec);
#include "ir/ops.def"
#undef OP

/// Writes `value` converted to `dtype` into n elements at dst.
void fill(void* dst, DType dtype, double value, int64_t n);

}  // namespace lazyrt::kernels
