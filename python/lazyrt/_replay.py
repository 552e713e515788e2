"""GraphInputMatcher: the inputs of a cached graph for a call, as in PyTorch/XLA's dynamo bridge.

A traced graph reads two kinds of inputs: the step's arguments, which change per call, and
captured values (weights, optimizer state), which the graph keeps reading from the tensors it
captured. The matcher puts the call's arguments where the graph reads an argument and the
captured values everywhere else, in graph order, ready for run_cached_graph.
"""


from lazyrt import _C


class GraphInputMatcher(_C._InputMatch):
    """Built from graph_inputs(...) of a traced step and the step's arguments' ids.

    tensor_id_to_arg_idx: {tensor_id(arg): position} for the traced step's arguments.
    graph_input_tensor_ids, graph_input_values: what graph_inputs(outputs) returned (or, on the
    lazyrt device, lazyrt.torch._get_tensors_xla_device_data_node).
    args_tensor_ids: the arguments' ids, as PyTorch/XLA's matcher takes them; when given, they
    must be tensor_id_to_arg_idx's.
    """

    def __init__(self, tensor_id_to_arg_idx, graph_input_tensor_ids, graph_input_values, args_tensor_ids=None):
        if len(graph_input_tensor_ids) != len(graph_input_values):
            raise ValueError("GraphInputMatcher: graph_input_tensor_ids and graph_input_values differ in length")
        if args_tensor_ids is not None and set(args_tensor_ids) != set(tensor_id_to_arg_idx):
            raise ValueError(f"GraphInputMatcher: args_tensor_ids {sorted(args_tensor_ids)} are not the ids of "
                             f"tensor_id_to_arg_idx, {sorted(tensor_id_to_arg_idx)}")
        self.tensor_id_to_arg_idx = dict(tensor_id_to_arg_idx)
        self.graph_input_tensor_ids = list(graph_input_tensor_ids)
        self.graph_input_values = list(graph_input_values)
        # Per graph input, the argument position feeding it, or None for a captured value.
        self._arg_of_input = [self.tensor_id_to_arg_idx.get(i) for i in self.graph_input_tensor_ids]
        # Its call (in C++): the graph's inputs for a call's arguments, in graph order.
        super().__init__(self._arg_of_input, self.graph_input_values)

    def __repr__(self):
        n_args = sum(a is not None for a in self._arg_of_input)
        return (f"GraphInputMatcher({len(self._arg_of_input)} graph inputs: {n_args} from arguments, "
                f"{len(self._arg_of_input) - n_args} captured)")
