// Structured loops. The body (and cond) are traced once per call into sub-graphs over
// placeholder tensors and compiled once: graph size, compile time and memory stay the same
// however many iterations run, and the trip count is data, so 10 and 100000 iterations share
// one compiled executable.
//
// Tensors the body or cond use from outside (weights, pending values) are captured
// automatically. Inside cond and body, values are symbolic: reading one (item, to_vector) or
// syncing throws, and so does modifying an outer tensor in place.
//
// Gradients: while_loop, fori_loop and scan are differentiable with respect to init, xs and
// the tensors the body reads from outside; backward runs the body's vector-Jacobian product
// over the trips in the other order. `snapshots` chooses its memory (see scan): 0 keeps the
// carry each trip starts from; s >= 1 keeps at most s and rebuilds the others. A while loop's
// trip count is data: a differentiated while_loop counts its trips as it runs, and its backward
// runs over that count, so one executable serves every count (with snapshots 0 the carries are
// kept in memory held while the backward runs). A differentiated fori_loop does the same with
// upper - lower.
#pragma once

#include <functional>
#include <vector>

#include "lazyrt/tensor.h"

namespace lazyrt {

using Carry = std::vector<Tensor>;

/// Runs body_fn while cond_fn gives a true one-element tensor. The body must return as many
/// values as init, each with its init's shape and dtype. Returns the final carries; a loop
/// that runs zero times returns init's values. `snapshots`: the gradient's memory policy.
Carry while_loop(std::function<Tensor(const Carry&)> cond_fn,
                 std::function<Carry(const Carry&)> body_fn, Carry init, int64_t snapshots = 0);

/// body_fn(i, carry) for i = lower, ..., upper - 1, with i an i64 scalar tensor. lower and
/// upper are inputs of the graph, not constants: any bounds share one executable (with
/// gradients too; see above). `snapshots`: the gradient's memory policy.
Carry fori_loop(int64_t lower, int64_t upper,
                std::function<Carry(const Tensor& i, const Carry&)> body_fn, Carry init,
                int64_t snapshots = 0);

/// fn(carry, x) -> (new carry, y), over the rows of xs: one row of every stacked input (dim 0)
/// per call, the carries threaded through. Returns the final carries and the ys, each y
/// stacked on a new dim 0 (PyTorch/XLA's and JAX's scan). The new carries keep init's shapes
/// and dtypes; every call must return ys of the same types (they are traced once). `reverse`
/// visits the rows from last to first (ys stay in row order). With no xs, `length` gives the
/// number of calls (x is then empty); with xs, it may be left at -1 or must match them.
/// Compiled once as one scan node: the length is part of the graph, and each row of xs is
/// read, and each row of ys written, in place.
using ScanFn = std::function<std::pair<Carry, Carry>(const Carry& carry, const Carry& x)>;
///
/// `snapshots`, the memory policy of the gradient: 0 keeps the carry each row starts from (one
/// carry per row, no recomputation); s >= 1 keeps none, and the backward rebuilds them from at
/// most s stored states by binomial checkpointing (Griewank's revolve): memory for s + 2
/// carries whatever the length N, and r*N - C(s+r, s+1) extra body evaluations, r the least
/// with C(s+r, s) >= N (the metric CheckpointForwardSteps counts them).
std::pair<Carry, Carry> scan(const ScanFn& fn, Carry init, Carry xs, bool reverse = false,
                             int64_t length = -1, int64_t snapshots = 0);

}  // namespace lazyrt
