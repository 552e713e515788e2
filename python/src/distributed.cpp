// lazyrt._C._distributed: process groups and collectives (distributed.h). The package's
// lazyrt.distributed wraps it with PyTorch's spellings (timeouts as timedelta, optimizers'
// parameter groups). Joining, barriers and syncs release the GIL: they wait for other processes.
#include <chrono>

#include "bindings.h"

namespace lazyrt::python {
namespace {

distributed::ReduceOp reduce_op(const std::string& op, const char* call) {
  if (op == "sum") return distributed::ReduceOp::Sum;
  if (op == "mean" || op == "avg") return distributed::ReduceOp::Mean;
  if (op == "max") return distributed::ReduceOp::Max;
  if (op == "min") return distributed::ReduceOp::Min;
  fail(call, ": op='", op, "' is not a reduction (expected 'sum', 'mean', 'max' or 'min')");
}

}  // namespace

void bind_distributed(py::module_& m) {
  py::module_ d = m.def_submodule("_distributed", "Process groups and collectives (distributed.h).");
  d.def("init_process_group",
        [](const std::string& init_method, int rank, int world_size, double timeout_s) {
          check(timeout_s > 0, "init_process_group: the timeout must be positive, got ", timeout_s, " s");
          distributed::InitOptions o;
          o.init_method = init_method;
          o.rank = rank;
          o.world_size = world_size;
          o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0 + 0.5));
          py::gil_scoped_release release;
          distributed::init_process_group(o);
        },
        py::arg("init_method") = "env://", py::arg("rank") = -1, py::arg("world_size") = -1,
        py::arg("timeout_s") = 300.0);
  d.def("is_initialized", &distributed::is_initialized);
  d.def("get_rank", &distributed::get_rank);
  d.def("get_world_size", &distributed::get_world_size);
  d.def("get_local_rank", &distributed::get_local_rank);
  d.def("barrier", &distributed::barrier, py::call_guard<py::gil_scoped_release>());
  d.def("destroy_process_group", &distributed::destroy_process_group, py::call_guard<py::gil_scoped_release>());
  d.def("all_reduce", [](const Tensor& t, const std::string& op) {
    return distributed::all_reduce(t, reduce_op(op, "all_reduce"));
  }, py::arg("tensor"), py::arg("op") = "sum");
  d.def("all_gather", &distributed::all_gather, py::arg("tensor"));
  d.def("reduce_scatter", [](const Tensor& t, const std::string& op) {
    return distributed::reduce_scatter(t, reduce_op(op, "reduce_scatter"));
  }, py::arg("tensor"), py::arg("op") = "sum");
  d.def("broadcast", &distributed::broadcast, py::arg("tensor"), py::arg("src") = 0);
  d.def("all_reduce_coalesced", [](const std::vector<Tensor>& tensors, const std::string& op, int64_t bucket_bytes) {
    check(bucket_bytes > 0, "all_reduce_coalesced: bucket_bytes must be positive, got ", bucket_bytes);
    return distributed::all_reduce_coalesced(tensors, reduce_op(op, "all_reduce_coalesced"), static_cast<size_t>(bucket_bytes));
  }, py::arg("tensors"), py::arg("op") = "sum", py::arg("bucket_bytes") = static_cast<int64_t>(distributed::kDefaultBucketBytes));
  d.def("all_reduce_gradients", [](const std::vector<Tensor>& params, const std::string& op, int64_t bucket_bytes) {
    check(bucket_bytes > 0, "all_reduce_gradients: bucket_bytes must be positive, got ", bucket_bytes);
    distributed::all_reduce_gradients(params, reduce_op(op, "all_reduce_gradients"), static_cast<size_t>(bucket_bytes));
  }, py::arg("params"), py::arg("op") = "mean", py::arg("bucket_bytes") = static_cast<int64_t>(distributed::kDefaultBucketBytes));
  d.def("broadcast_parameters", &distributed::broadcast_parameters, py::arg("tensors"), py::arg("src") = 0,
        py::call_guard<py::gil_scoped_release>());
  d.attr("DEFAULT_BUCKET_BYTES") = static_cast<int64_t>(distributed::kDefaultBucketBytes);
}

}  // namespace lazyrt::python
