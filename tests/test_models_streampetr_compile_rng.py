"""StreamPETR's compiled step on CUDA with a checkpointed decoder (``with_cp``, as published): its dropout must not be
replayed through ``run_and_save_rng_state`` / ``run_with_rng_state``, which inductor does not capture in a CUDA graph
(``reduce-overhead`` would split each bucket's graphs at every one). ``StreamPETR.step_compile_options`` turns
``fallback_random`` off there, so AOTAutograd replays the checkpointed draws graph-safely."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from drivetrain.engine.build import step_compile_options
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.decoder import Decoder

SMALL = {"embed_dims": 32, "num_layers": 1, "num_query": 8, "memory_len": 8, "topk": 4, "num_propagated": 2}
REPLAYS = {"run_and_save_rng_state", "run_with_rng_state"}  # inductor's FORBIDDEN_CUDAGRAPH_OPS among the RNG ops


class _Seen(CustomGraphPass):
    """Notes the RNG replay ops of every post-grad graph inductor compiles (forward and backward)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.names += [str(n.target) for n in graph.nodes if n.op == "call_function" and str(n.target) in REPLAYS]

    def uuid(self) -> None:  # no cache entry: every compile runs the pass
        return None


def replays_in_checkpointed_decoder(device: torch.device, options: dict) -> list[str]:
    """The RNG replay ops inductor meets compiling a 2-layer checkpointed decoder's forward and backward."""
    torch.manual_seed(0)
    decoder = Decoder(num_layers=2, embed_dims=16, num_heads=2, ffn_dims=32, dropout=0.1, with_cp=True)
    decoder = decoder.to(device).train()
    b, q, t, m = 2, 6, 10, 4
    args = [torch.randn(b, n, 16, device=device) for n in (q, q, t, t, m, m)]
    seen = _Seen()
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(post_grad_custom_post_pass=seen):
            step = torch.compile(lambda *a: decoder(*a).sum(), fullgraph=True, dynamic=False, options=options)
            step(*args).backward()
    finally:
        torch._dynamo.reset()
    return seen.names


def test_with_fallback_random_a_checkpointed_decoders_dropout_is_replayed_by_ops_cuda_graphs_refuse():
    """The check the CUDA test makes can fail: with the engine's default (``fallback_random``) the replays are there
    (on a CPU they always are: no graph-safe generator)."""
    names = replays_in_checkpointed_decoder(torch.device("cpu"), {"fallback_random": True})
    assert set(names) == REPLAYS  # one pair per dropout of each checkpointed layer
    assert names.count("run_and_save_rng_state") == names.count("run_with_rng_state") > 0


def test_the_model_asks_cuda_for_inductors_generator_only_with_a_checkpointed_decoder():
    for with_cp, expected in ((True, False), (False, True)):
        model = StreamPETR(with_cp=with_cp, **SMALL)
        assert step_compile_options(model, torch.device("cuda"), "reduce-overhead")["fallback_random"] is expected
        assert step_compile_options(model, torch.device("cpu"))["fallback_random"] is True  # torch's draws on a CPU


@pytest.mark.cuda
@pytest.mark.heavy
@pytest.mark.compiles
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_checkpointed_decoder_compiles_without_replay_ops():
    model = StreamPETR(with_cp=True, **SMALL)
    options = step_compile_options(model, torch.device("cuda"), "reduce-overhead")
    assert replays_in_checkpointed_decoder(torch.device("cuda"), options) == []
