// lazyrt._C: the pybind11 module behind the lazyrt package. Each area binds itself in its own
// file; the package (python/lazyrt) adds the pure-Python parts.
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using namespace lazyrt::python;
  m.doc() = "lazyrt's C++ API (the lazyrt package wraps it)";
  py::register_exception<lazyrt::Error>(m, "Error", PyExc_RuntimeError);

  bind_dtypes(m);
  py::class_<lazyrt::Tensor> tensor(m, "Tensor", "A lazy tensor: ops record a graph, reading a value runs it.");
  bind_tensor(m, tensor);
  bind_interop(m, tensor);
  bind_ops(m, tensor);
  bind_indexing(tensor);
  bind_loops(m);
  bind_replay(m);
  bind_nn(m);
  bind_optim(m);
  bind_metrics_cache(m);
  bind_distributed(m);
}
