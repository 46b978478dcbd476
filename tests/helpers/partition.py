"""AOTAutograd's forward/backward split as inductor makes it, without code generation: which graph inputs the
forward writes in place and keeps for the backward (a backward reading such an input sees the written values)."""

from __future__ import annotations

import functools

import torch


def inductor_partition_backend() -> tuple[object, list[set[str]]]:
    """A ``torch.compile`` backend that partitions as inductor does (its decompositions, the min-cut partitioner,
    inference input mutations kept in the graph) and runs the graphs as they are; and the list it fills, one set per
    forward graph: the names of the inputs that graph writes (``aten.copy_`` into a placeholder) and also returns
    for its backward."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    kept_written: list[set[str]] = []

    def forward_compiler(gm: torch.fx.GraphModule, example_inputs):
        written = {n.args[0].name for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)
                   if n.args[0].op == "placeholder"}  # fmt: skip
        outputs = next(iter(gm.graph.find_nodes(op="output"))).args[0]
        kept_written.append({n.name for n in outputs if isinstance(n, torch.fx.Node) and n.name in written})
        return make_boxed_func(gm.forward)

    backend = aot_autograd(
        fw_compiler=forward_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
        decompositions=select_decomp_table(), keep_inference_input_mutations=True,
        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
    )  # fmt: skip
    return backend, kept_written
