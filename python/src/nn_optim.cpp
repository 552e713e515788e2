// nn and optim from Python: gradient mode, the losses of nn.h, the C++ modules of nn.h
// (lazyrt._C._nn; the lazyrt.nn package builds PyTorch-style Python modules on the same ops),
// and the optimizers of optim.h (lazyrt._C._optim, wrapped by lazyrt.optim).
#include "bindings.h"

namespace lazyrt::python {

namespace {

using py::arg;

std::optional<Tensor> maybe(const Tensor& t) {
  if (!t.defined()) return std::nullopt;
  return t;
}

py::list named(const nn::NamedTensors& ts) {
  py::list out;
  for (const auto& [name, t] : ts) out.append(py::make_tuple(name, t));
  return out;
}

nn::StateDict state_dict_from(py::handle d) {
  nn::StateDict sd;
  py::object items = py::hasattr(d, "items") ? d.attr("items")() : py::reinterpret_borrow<py::object>(d);
  for (py::handle kv : items) {
    auto pair = kv.cast<py::tuple>();
    sd.emplace_back(pair[0].cast<std::string>(), pair[1].cast<Tensor>());
  }
  return sd;
}

}  // namespace

void bind_nn(py::module_& m) {
  m.def("is_grad_enabled", &grad_enabled, "Whether ops record gradients (per thread).");
  m.def("_set_grad_enabled", &set_grad_enabled, arg("mode"));

  py::module_ nn_m = m.def_submodule("_nn", "The C++ modules and losses of nn.h.");
  nn_m.def("mse_loss", &nn::mse_loss, arg("input"), arg("target"), arg("reduction") = "mean");
  nn_m.def("cross_entropy", [](const Tensor& x, const Tensor& t, double label_smoothing, const std::string& reduction,
                               int64_t ignore_index) {
    return nn::cross_entropy(x, t, label_smoothing, reduction, ignore_index);
  }, arg("input"), arg("target"), arg("label_smoothing") = 0.0, arg("reduction") = "mean", arg("ignore_index") = -100);
  // The functional layers; lazyrt.nn.functional gives them torch's signatures.
  nn_m.def("batch_norm", [](const Tensor& x, std::optional<Tensor> rm, std::optional<Tensor> rv,
                            std::optional<Tensor> w, std::optional<Tensor> b, bool training,
                            std::optional<double> momentum, double eps, std::optional<Tensor> count) {
    return nn::batch_norm(x, rm.value_or(Tensor()), rv.value_or(Tensor()), w.value_or(Tensor()),
                          b.value_or(Tensor()), training, momentum, eps, count.value_or(Tensor()));
  }, arg("input"), arg("running_mean"), arg("running_var"), arg("weight") = py::none(), arg("bias") = py::none(),
     arg("training") = false, arg("momentum") = 0.1, arg("eps") = 1e-5, arg("num_batches_tracked") = py::none());
  nn_m.def("group_norm", [](const Tensor& x, int64_t groups, std::optional<Tensor> w, std::optional<Tensor> b,
                            double eps) {
    return nn::group_norm(x, groups, w.value_or(Tensor()), b.value_or(Tensor()), eps);
  }, arg("input"), arg("num_groups"), arg("weight") = py::none(), arg("bias") = py::none(), arg("eps") = 1e-5);
  nn_m.def("adaptive_avg_pool2d", [](const Tensor& x, std::vector<std::optional<int64_t>> size) {
    std::vector<int64_t> s;
    for (const auto& v : size) s.push_back(v.value_or(-1));  // None keeps that dim
    return nn::adaptive_avg_pool2d(x, s);
  }, arg("input"), arg("output_size"));
  nn_m.def("interpolate", &nn::interpolate, arg("input"), arg("size"), arg("scale_factor"), arg("mode"),
           arg("align_corners"));
  nn_m.def("scaled_dot_product_attention", [](const Tensor& q, const Tensor& k, const Tensor& v,
                                              std::optional<Tensor> mask, double dropout_p, bool is_causal,
                                              std::optional<double> scale) {
    return nn::scaled_dot_product_attention(q, k, v, mask.value_or(Tensor()), dropout_p, is_causal, scale);
  }, arg("query"), arg("key"), arg("value"), arg("attn_mask") = py::none(), arg("dropout_p") = 0.0,
     arg("is_causal") = false, arg("scale") = py::none());
  nn_m.def("binary_cross_entropy_with_logits", &nn::binary_cross_entropy_with_logits, arg("input"),
           arg("target"), arg("reduction") = "mean");
  nn_m.def("log_softmax", [](const Tensor& a, int64_t dim) { return log_softmax(a, dim); }, arg("input"), arg("dim"));

  py::class_<nn::Module, std::shared_ptr<nn::Module>>(nn_m, "Module")
      .def("forward", &nn::Module::forward, arg("input"))
      .def("__call__", &nn::Module::forward, arg("input"))
      .def("parameters", &nn::Module::parameters, arg("recurse") = true)
      .def("named_parameters", [](const nn::Module& mod, bool r) { return named(mod.named_parameters(r)); },
           arg("recurse") = true)
      .def("named_buffers", [](const nn::Module& mod, bool r) { return named(mod.named_buffers(r)); },
           arg("recurse") = true)
      .def("children", [](const nn::Module& mod) {
        py::list out;
        for (const auto& [name, child] : mod.children()) out.append(py::make_tuple(name, child));
        return out;
      })
      .def("state_dict", [](const nn::Module& mod) {
        py::object od = py::module_::import("collections").attr("OrderedDict")();
        for (const auto& [name, t] : mod.state_dict()) od[py::str(name)] = t;
        return od;
      })
      .def("load_state_dict", [](nn::Module& mod, py::handle state, bool strict) {
        mod.load_state_dict(state_dict_from(state), strict);
      }, arg("state_dict"), arg("strict") = true)
      .def("train", &nn::Module::train, arg("mode") = true)
      .def("eval", &nn::Module::eval)
      .def_property_readonly("training", &nn::Module::is_training)
      .def("zero_grad", &nn::Module::zero_grad, arg("set_to_none") = true)
      .def_property_readonly("type_name", &nn::Module::type_name)
      .def("register_parameter", &nn::Module::register_parameter, arg("name"), arg("value"),
           arg("requires_grad") = true)
      .def("register_buffer", &nn::Module::register_buffer, arg("name"), arg("value"))
      .def("register_module", [](nn::Module& mod, const std::string& name, std::shared_ptr<nn::Module> child) {
        return mod.register_module(name, std::move(child));
      }, arg("name"), arg("module"));
  py::class_<nn::Linear, nn::Module, std::shared_ptr<nn::Linear>>(nn_m, "Linear")
      .def(py::init<int64_t, int64_t, bool>(), arg("in_features"), arg("out_features"), arg("bias") = true)
      .def_property_readonly("weight", [](const nn::Linear& l) { return l.weight; })
      .def_property_readonly("bias", [](const nn::Linear& l) { return maybe(l.bias); });
  py::class_<nn::Sequential, nn::Module, std::shared_ptr<nn::Sequential>>(nn_m, "Sequential")
      .def(py::init([](py::args modules) {
        auto s = std::make_shared<nn::Sequential>();
        for (py::handle h : modules) s->push_back(h.cast<std::shared_ptr<nn::Module>>());
        return s;
      }))
      .def("append", [](nn::Sequential& s, std::shared_ptr<nn::Module> mod) { s.push_back(std::move(mod)); },
           arg("module"))
      .def("__len__", &nn::Sequential::size);
  py::class_<nn::ReLU, nn::Module, std::shared_ptr<nn::ReLU>>(nn_m, "ReLU").def(py::init<>());
  py::class_<nn::Tanh, nn::Module, std::shared_ptr<nn::Tanh>>(nn_m, "Tanh").def(py::init<>());
  py::class_<nn::Sigmoid, nn::Module, std::shared_ptr<nn::Sigmoid>>(nn_m, "Sigmoid").def(py::init<>());
  py::class_<nn::Dropout, nn::Module, std::shared_ptr<nn::Dropout>>(nn_m, "Dropout")
      .def(py::init<double>(), arg("p") = 0.5)
      .def_readonly("p", &nn::Dropout::p);
}

namespace {

// A copy of `options` with one field changed.
template <class Options, class Field, class Value>
Options with(Options options, Field Options::*field, Value v) {
  options.*field = v;
  return options;
}

}  // namespace

void bind_optim(py::module_& m) {
  py::module_ o = m.def_submodule("_optim", "The C++ optimizers of optim.h.");
  py::class_<optim::Optimizer>(o, "Optimizer")
      .def("step", [](optim::Optimizer& opt, std::optional<Tensor> found_inf) {
        opt.step(found_inf ? *found_inf : Tensor());
      }, arg("found_inf") = py::none(),
         "One update (traced, like the forward). Where found_inf is non-zero nothing changes.")
      .def("zero_grad", &optim::Optimizer::zero_grad, arg("set_to_none") = true)
      .def("params", [](const optim::Optimizer& opt) { return opt.params(); })
      .def("state", &optim::Optimizer::state, "Every state tensor, the step count first.")
      .def_property_readonly("step_count", [](const optim::Optimizer& opt) { return opt.step_count(); },
                             "The step count, an f64 scalar tensor.");

  py::class_<optim::SGD, optim::Optimizer>(o, "SGD")
      .def(py::init([](std::vector<Tensor> params, double lr, double momentum, double dampening,
                       double weight_decay, bool nesterov) {
        return new optim::SGD(std::move(params), {lr, momentum, dampening, weight_decay, nesterov});
      }), arg("params"), arg("lr"), arg("momentum"), arg("dampening"), arg("weight_decay"), arg("nesterov"))
      .def_property("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr)
      .def_property("momentum", [](const optim::SGD& s) { return s.options().momentum; },
                    [](optim::SGD& s, double v) { s.set_options(with(s.options(), &optim::SGDOptions::momentum, v)); })
      .def_property("dampening", [](const optim::SGD& s) { return s.options().dampening; },
                    [](optim::SGD& s, double v) { s.set_options(with(s.options(), &optim::SGDOptions::dampening, v)); })
      .def_property("weight_decay", [](const optim::SGD& s) { return s.options().weight_decay; },
                    [](optim::SGD& s, double v) { s.set_options(with(s.options(), &optim::SGDOptions::weight_decay, v)); })
      .def_property("nesterov", [](const optim::SGD& s) { return s.options().nesterov; },
                    [](optim::SGD& s, bool v) { s.set_options(with(s.options(), &optim::SGDOptions::nesterov, v)); });

  auto adam_options = [](double lr, std::pair<double, double> betas, double eps, double weight_decay) {
    return optim::AdamOptions{lr, betas.first, betas.second, eps, weight_decay};
  };
  py::class_<optim::Adam, optim::Optimizer>(o, "Adam")
      .def(py::init([adam_options](std::vector<Tensor> params, double lr, std::pair<double, double> betas,
                                   double eps, double weight_decay) {
        return new optim::Adam(std::move(params), adam_options(lr, betas, eps, weight_decay));
      }), arg("params"), arg("lr"), arg("betas"), arg("eps"), arg("weight_decay"))
      .def_property("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr)
      .def_property("betas", [](const optim::Adam& a) { return std::make_pair(a.options().beta1, a.options().beta2); },
                    [](optim::Adam& a, std::pair<double, double> b) {
                      optim::AdamOptions o = a.options();
                      o.beta1 = b.first;
                      o.beta2 = b.second;
                      a.set_options(o);
                    })
      .def_property("eps", [](const optim::Adam& a) { return a.options().eps; },
                    [](optim::Adam& a, double v) { a.set_options(with(a.options(), &optim::AdamOptions::eps, v)); })
      .def_property("weight_decay", [](const optim::Adam& a) { return a.options().weight_decay; },
                    [](optim::Adam& a, double v) { a.set_options(with(a.options(), &optim::AdamOptions::weight_decay, v)); });
  py::class_<optim::AdamW, optim::Adam>(o, "AdamW")
      .def(py::init([adam_options](std::vector<Tensor> params, double lr, std::pair<double, double> betas,
                                   double eps, double weight_decay) {
        return new optim::AdamW(std::move(params), adam_options(lr, betas, eps, weight_decay));
      }), arg("params"), arg("lr"), arg("betas"), arg("eps"), arg("weight_decay"));
}

}  // namespace lazyrt::python
