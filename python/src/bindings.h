// Shared vocabulary of the lazyrt._C bindings: how Python values become lazyrt arguments
// (dtype objects, numbers as Scalars with their kind, dims, shapes), and the helper that binds
// one op as both a module function and a Tensor method.
//
// GIL policy: every call that can compile or execute a graph (syncs, item, numpy, replays,
// warm-up) releases the GIL; tracing an op does not (it is cheaper than a release). Where C++
// calls back into Python (loop bodies, compile_step tracing) the callback acquires the GIL,
// so those calls work whether or not the caller released it.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <lazyrt/lazyrt.h>

namespace lazyrt::python {

namespace py = pybind11;

/// Throws lazyrt::Error with the parts written one after another, as the C++ API words its errors.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  throw Error(s.str());
}
/// fail(parts...) unless ok.
template <class... Parts>
void check(bool ok, const Parts&... parts) {
  if (!ok) fail(parts...);
}

/// The Python face of a DType: lazyrt.float32 and friends, one object per dtype.
struct DTypeObject {
  DType dtype;
};
/// The object standing for `dtype` (a new reference).
py::object dtype_object(DType dtype);
/// PyTorch's name of a dtype ("float32", "bool").
const char* dtype_py_name(DType dtype);

/// A `dim` argument: None, an int, or a sequence of ints. Empty means every dim.
struct Dims {
  std::vector<int64_t> dims;
  bool given = false;
};

/// A shape given as separate ints (t.reshape(2, 3)) or one sequence (t.reshape((2, 3))).
Shape shape_from_args(const py::args& args, const char* op);
/// The same, or given as the one keyword `key` (t.reshape(shape=(2, 3)), as PyTorch takes it).
Shape shape_from_args(const py::args& args, const py::kwargs& kwargs, const char* key, const char* op);
/// A sequence of ints.
Shape shape_from_sequence(py::handle seq, const char* op);

/// The dtype a Python number takes next to tensor `like` (PyTorch's wrapped-number rule):
/// the tensor's own dtype unless the number brings a higher category.
DType scalar_dtype(Scalar s, DType like);
/// A graph constant holding a Python number, typed to act like that number next to `like`.
Tensor scalar_like(Scalar s, const Tensor& like);

/// a ** e for a Python number e, refusing what PyTorch refuses.

/// Tensors from a sequence (or a lone tensor) of lazyrt tensors; `what` names the call.
std::vector<Tensor> tensors_from(py::handle seq, const char* what);
py::tuple to_tuple(const std::vector<Tensor>& ts);
/// Syncs a tensor whose value is about to be read, without the GIL, and gives its elements in
/// host memory (Tensor::host_data).
std::shared_ptr<const void> host_released(const Tensor& t);
py::list to_list(const std::vector<Tensor>& ts);

/// Binds one op under one name as a module function (first argument `input`) and, unless
/// it is only a function, as a Tensor method. Adding an op to Python is one line here.
class OpBinder {
 public:
  OpBinder(py::module_& m, py::class_<Tensor>& tensor) : m_(m), tensor_(tensor) {}

  /// lazyrt.name(input, ...) and Tensor.name(...).
  template <class F, class... Extra>
  OpBinder& op(const char* name, F f, const Extra&... extra) {
    m_.def(name, f, py::arg("input"), extra...);
    tensor_.def(name, f, extra...);
    return *this;
  }
  /// lazyrt.name(...) only: creation functions and ops without a tensor first.
  template <class F, class... Extra>
  OpBinder& fn(const char* name, F f, const Extra&... extra) {
    m_.def(name, f, extra...);
    return *this;
  }
  /// Tensor.name(...) only.
  template <class F, class... Extra>
  OpBinder& method(const char* name, F f, const Extra&... extra) {
    tensor_.def(name, f, extra...);
    return *this;
  }

 private:
  py::module_& m_;
  py::class_<Tensor>& tensor_;
};

// One function per area; module.cpp calls them in order.
void bind_dtypes(py::module_& m);
void bind_tensor(py::module_& m, py::class_<Tensor>& cls);
void bind_interop(py::module_& m, py::class_<Tensor>& cls);
void bind_ops(py::module_& m, py::class_<Tensor>& cls);
/// Tensor.__getitem__ / __setitem__ (indexing.cpp).
void bind_indexing(py::class_<Tensor>& cls);
/// A Python index key (t[key]) as Tensor::index takes it.
std::vector<indexing::TensorIndex> index_of_key(py::handle key);
void bind_loops(py::module_& m);
void bind_replay(py::module_& m);
void bind_nn(py::module_& m);
void bind_optim(py::module_& m);
void bind_metrics_cache(py::module_& m);
void bind_distributed(py::module_& m);

}  // namespace lazyrt::python

// ---- conversions ------------------------------------------------------------------------------

namespace pybind11::detail {

/// lazyrt.float32 etc. <-> DType.
template <>
struct type_caster<lazyrt::DType> {
  PYBIND11_TYPE_CASTER(lazyrt::DType, const_name("lazyrt.dtype"));
  bool load(handle src, bool) {
    if (!isinstance<lazyrt::python::DTypeObject>(src)) return false;
    value = src.cast<const lazyrt::python::DTypeObject&>().dtype;
    return true;
  }
  static handle cast(lazyrt::DType d, return_value_policy, handle) {
    return lazyrt::python::dtype_object(d).release();
  }
};

/// A Python number keeps its kind: bool, int or float (NumPy scalars too), as PyTorch's type
/// promotion needs. Tensors are never taken as numbers.
template <>
class type_caster<lazyrt::Scalar> {
 public:
  static constexpr auto name = const_name("bool | int | float");
  bool load(handle src, bool convert);
  static handle cast(const lazyrt::Scalar& s, return_value_policy, handle) {
    switch (s.kind()) {
      case lazyrt::Scalar::Kind::Bool: return pybind11::bool_(s.to_double() != 0).release();
      case lazyrt::Scalar::Kind::Int: return pybind11::int_(static_cast<long long>(s.to_double())).release();
      case lazyrt::Scalar::Kind::Float: return pybind11::float_(s.to_double()).release();
    }
    return none().release();
  }
  template <typename>
  using cast_op_type = lazyrt::Scalar;
  operator lazyrt::Scalar() { return value; }

 private:
  lazyrt::Scalar value{0.0};
};

/// dim=None | int | sequence of ints.
template <>
struct type_caster<lazyrt::python::Dims> {
  PYBIND11_TYPE_CASTER(lazyrt::python::Dims, const_name("int | Sequence[int] | None"));
  bool load(handle src, bool convert);
  static handle cast(const lazyrt::python::Dims&, return_value_policy, handle) { return none().release(); }
};

}  // namespace pybind11::detail
