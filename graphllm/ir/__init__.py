"""IR: capture of the model step as a torch.fx graph with its weights (see capture.py for why export)."""

from graphllm.ir.capture import STEP_INPUT_NAMES, StepModule, capture, example_step_inputs
from graphllm.ir.graph import StepGraph, diff_graphs, format_graph, module_path, op_counts

__all__ = ["STEP_INPUT_NAMES", "StepGraph", "StepModule", "capture", "diff_graphs", "example_step_inputs",
           "format_graph", "module_path", "op_counts"]
