"""Golden numbers: each model input is counted once, in the ``inputs`` line (issue 32).

The inputs are live from the start of the step to its end (the caller holds them); until issue
32 the forward's replay also started from their bytes, so every moment's ``activations`` held
them a second time. Graph: ``input_ids`` [2, 16] int64 -> embedding (10 x 4) -> linear (4 -> 3).

* weights: (10 x 4 + 4 x 3 + 3) params x 4 B = 220 B
* inputs: 32 ids x 8 B = 256 B (training: + 32 int64 labels x 8 B = 512 B)
* embedding output 2 x 16 x 4 x 4 B = 512 B; linear output (the logits) 2 x 16 x 3 x 4 B = 384 B
"""

from __future__ import annotations

import re

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.graph.ops import TensorKind
from app.domain.memory.estimate import MemoryRequest, estimate_memory
from app.domain.workload import Mode, Optimizer, Runtime

IDS = InputDecl(name="input_ids", shape=("batch", "seq"), kind=TensorKind.INDEX)
LAYERS = [
    {"name": "emb", "op": "embedding", "num_embeddings": 10, "embedding_dim": 4},
    {"name": "fc", "op": "linear", "out_features": 3},
]


def _lines(mode: Mode, runtime: Runtime) -> tuple[int, dict[str, int], dict[str, str]]:
    analysis = analyze(
        [IDS], LAYERS, {"batch": 2, "seq": 16}, training=mode is Mode.TRAINING, runtime=runtime
    )
    request = MemoryRequest(mode=mode, runtime=runtime, optimizer=Optimizer.SGD)
    estimate = estimate_memory(analysis, request)
    return (
        estimate.peak_bytes,
        {line.key: line.bytes for line in estimate.lines},
        {line.key: line.formula for line in estimate.lines},
    )


def test_inference_counts_the_token_ids_once() -> None:
    peak, lines, formulas = _lines(Mode.INFERENCE, Runtime.CPU)
    assert lines["inputs"] == 256
    # during 'fc': the embedding's output and the logits; not the ids (was 896 + 256)
    assert lines["activations"] == 512 + 384
    assert "model inputs" not in formulas["activations"]
    assert peak == 220 + 256 + 896 == 1_372  # was 1,628


def test_training_counts_the_token_ids_once() -> None:
    peak, lines, _ = _lines(Mode.TRAINING, Runtime.CPU)
    assert lines["inputs"] == 256 + 256  # ids and labels
    # in the loss's backward: the embedding's output that fc keeps (was 512 + 256)
    assert lines["activations"] == 512
    assert "outputs" not in lines  # the loop dropped the logits (app.domain.memory.loss)
    # weights, inputs, activations, loss (96 fp32 log-probabilities), transient (nll_loss's
    # and log_softmax's fp32 gradients)
    assert peak == 220 + 512 + 512 + 384 + 2 * 384 == 2_396  # was 2,652 with the ids twice


def test_the_breakdown_adds_up_to_the_cuda_replays_requested_bytes() -> None:
    """The caching-allocator replay allocates each input once: its peak of requested bytes (in
    the allocator_rounding formula, peak allocated - peak requested) is the breakdown's tensors,
    every line but the allocator's and the context, to the byte (it was the breakdown less the
    input bytes)."""
    for mode in Mode:
        _, lines, formulas = _lines(mode, Runtime.CUDA)
        tensors = sum(
            size
            for key, size in lines.items()
            if key not in ("allocator_rounding", "fragmentation_reserve", "cuda_context")
        )
        found = re.search(r"- ([\d,]+) \[B: peak requested\]", formulas["allocator_rounding"])
        assert found is not None
        assert int(found.group(1).replace(",", "")) == tensors
