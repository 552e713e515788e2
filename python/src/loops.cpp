// lazyrt._C.while_loop, fori_loop and scan over Python callables (lazyrt/_loops.py wraps them
// for pytrees).
//
// while_loop(cond_fn, body_fn, init) follows torch's while_loop: the carries are passed as
// separate arguments, cond_fn(*carry) returns a one-element tensor, body_fn(*carry) a tuple
// (or a lone tensor when there is one carry); the result is a tuple.
// fori_loop(lower, upper, body_fn, init) follows JAX's: body_fn(i, carry) gets the carry in
// init's structure (a tensor, or a tuple) and returns the new carry in that structure.
// scan(fn, init, xs, reverse, length) is flat: fn(carry, x) gets two tuples of tensors and
// returns a pair (new carry, ys) of tuples; the result is the pair (final carry, stacked ys).
//
// The C++ loop calls the callables while it traces, once each. Python exceptions raised in them
// pass through unchanged; lazyrt errors become lazyrt.Error.
#include "bindings.h"

namespace lazyrt::python {

namespace {

std::vector<Tensor> carries_of(py::handle r, const char* op, const char* fn) {
  if (py::isinstance<Tensor>(r)) return {r.cast<Tensor>()};
  if (!py::isinstance<py::tuple>(r) && !py::isinstance<py::list>(r))
    throw Error(std::string(op) + ": " + fn + " must return a tuple of lazyrt tensors, got " +
                std::string(py::str(py::type::handle_of(r).attr("__name__"))));
  return tensors_from(r, op);
}

Tensor tensor_result(py::handle r, const char* op, const char* fn) {
  if (!py::isinstance<Tensor>(r))
    throw Error(std::string(op) + ": " + fn + " must return a one-element lazyrt tensor, got " +
                std::string(py::str(py::type::handle_of(r).attr("__name__"))));
  return r.cast<Tensor>();
}

py::tuple while_loop_py(py::function cond_fn, py::function body_fn, py::handle init, int64_t snapshots) {
  Carry carry = tensors_from(init, "while_loop");
  Carry out = while_loop(
      [&](const Carry& c) {
        py::gil_scoped_acquire gil;
        return tensor_result(cond_fn(*to_tuple(c)), "while_loop", "cond_fn");
      },
      [&](const Carry& c) {
        py::gil_scoped_acquire gil;
        return carries_of(body_fn(*to_tuple(c)), "while_loop", "body_fn");
      },
      std::move(carry), snapshots);
  return to_tuple(out);
}

py::object fori_loop_py(int64_t lower, int64_t upper, py::function body_fn, py::handle init, int64_t snapshots) {
  const bool single = py::isinstance<Tensor>(init);
  Carry carry = tensors_from(init, "fori_loop");
  Carry out = fori_loop(
      lower, upper,
      [&](const Tensor& i, const Carry& c) {
        py::gil_scoped_acquire gil;
        py::object r = body_fn(i, single ? py::cast(c[0]) : py::object(to_tuple(c)));
        return carries_of(r, "fori_loop", "body_fn");
      },
      std::move(carry), snapshots);
  if (single) return py::cast(out[0]);
  return to_tuple(out);
}

py::tuple scan_py(py::function fn, py::handle init, py::handle xs, bool reverse, int64_t length,
                  int64_t snapshots) {
  auto [carry, ys] = scan(
      [&](const Carry& c, const Carry& x) {
        py::gil_scoped_acquire gil;
        py::object r = fn(to_tuple(c), to_tuple(x));
        if (!py::isinstance<py::tuple>(r) || py::len(r) != 2)
          throw Error("scan: fn must return a pair (carry, ys), got " +
                      std::string(py::str(py::type::handle_of(r).attr("__name__"))));
        auto pair = r.cast<py::tuple>();
        return std::make_pair(carries_of(pair[0], "scan", "fn"), carries_of(pair[1], "scan", "fn"));
      },
      tensors_from(init, "scan"), tensors_from(xs, "scan"), reverse, length, snapshots);
  return py::make_tuple(to_tuple(carry), to_tuple(ys));
}

}  // namespace

void bind_loops(py::module_& m) {
  m.def("while_loop", &while_loop_py, py::arg("cond_fn"), py::arg("body_fn"), py::arg("init"),
        py::arg("snapshots") = 0,
        "Runs body_fn(*carry) while cond_fn(*carry) is true, as one loop node: the body is traced "
        "and compiled once, whatever the trip count. Returns the final carries as a tuple. "
        "Differentiable; snapshots is the gradient's memory policy, as for scan.");
  m.def("fori_loop", &fori_loop_py, py::arg("lower"), py::arg("upper"), py::arg("body_fn"), py::arg("init"),
        py::arg("snapshots") = 0,
        "carry = body_fn(i, carry) for i in range(lower, upper), as one loop node; i is an int64 "
        "scalar tensor. init is a tensor or a tuple of tensors; the result has its structure.");
  m.def("scan", &scan_py, py::arg("fn"), py::arg("init"), py::arg("xs"), py::arg("reverse") = false,
        py::arg("length") = -1, py::arg("snapshots") = 0,
        "(carry, ys) = scan(fn, init, xs): fn(carry, x) -> (carry, y) over the rows of xs, as one "
        "scan node. Flat: init and xs are tuples of tensors, fn gets and returns tuples.");
}

}  // namespace lazyrt::python
