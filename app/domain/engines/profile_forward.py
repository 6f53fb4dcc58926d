"""The activation peak of an engine's profile forward, from the model's graph.

vLLM 0.19 profiles one forward of ``max_num_batched_tokens`` dummy tokens before the KV cache
exists (``vllm/v1/worker/gpu_model_runner.py``: ``GPUModelRunner.profile_run`` calls
``_dummy_run(self.max_num_tokens, is_profile=True)``). ``_dummy_run`` spreads the tokens over
``num_reqs = min(num_tokens, max_num_seqs)`` dummy requests, but the model runs on the tokens
flattened into one ``[num_tokens, hidden]`` batch: every linear, norm and MLP sees
``num_tokens`` rows, as a batch of 1 sequence of ``num_tokens`` tokens does. Attention runs
without KV-cache writes (no cache is allocated yet) and, with the flash-attention backend, never
materialises scores; the forward computes no logits (``_dummy_sampler_run`` computes them
afterwards for ``num_reqs`` rows only: :func:`app.domain.engines.vllm.sampler_peak_bytes`).

So the forward is the memory engine's inference estimate (:mod:`app.domain.memory`) of the graph
at batch 1 x ``tokens``, per tensor-parallel rank, in the engine's dtype, with flash attention
(memory-efficient for fp32, which flash does not take), no KV cache and the head over the last
position only. The peak is what ``torch.cuda.max_memory_allocated`` adds over the loaded model:
the estimate's allocated bytes less its weights and buffers (vLLM's "torch peak memory
increase" is that difference). A pipeline stage's forward peaks inside a decoder layer, which
every stage runs, so the figure is each stage's; what a later stage receives is added by
:func:`app.domain.engines.vllm.engine_memory`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.graph.analysis import InputDecl
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Attention, Logits, Mode, Parallelism, Runtime

# vLLM's --dtype names as the memory engine's precision conventions (activations in that dtype).
_PRECISION: dict[str, Precision] = {
    "bfloat16": Precision.BF16,
    "float16": Precision.FP16,
    "half": Precision.FP16,
    "float32": Precision.FP32,
    "float": Precision.FP32,
}

# The estimate's lines that make up the allocated increase over the loaded model.
_FORWARD_LINES = ("inputs", "activations", "transient", "workspace", "allocator_rounding")


class ProfileGraphError(ValueError):
    """A graph whose profile forward cannot be laid out (no 2-D token input, or a dtype the
    memory engine has no convention for)."""


@dataclass(frozen=True)
class GraphForwardPeak:
    """The graph's profile-forward peak on one tensor-parallel rank [B].

    ``peak_bytes``: allocated bytes over the weights and buffers at the forward's peak;
    ``lines``: its parts (the memory estimate's lines: inputs, activations, transient, cuBLAS
    workspace, allocator rounding); ``where``: the moment of the peak as the estimate words it
    (e.g. "during the forward of 'layers.0.mlp'").
    """

    peak_bytes: int
    tokens: int
    tensor_parallel_size: int
    dtype: str
    attention: str
    where: str
    lines: tuple[tuple[str, int], ...]


def profile_forward_request(dtype: str, tensor_parallel_size: int) -> MemoryRequest:
    """The memory request of the profile forward (see the module docstring).

    Raises
    ------
    ProfileGraphError
        A dtype that is not one of vLLM's float dtypes.
    """
    try:
        precision = _PRECISION[dtype]
    except KeyError:
        raise ProfileGraphError(
            f"dtype '{dtype}' has no activation precision (one of {sorted(_PRECISION)})"
        ) from None
    return MemoryRequest(
        mode=Mode.INFERENCE,
        precision=precision,
        runtime=Runtime.CUDA,
        parallelism=Parallelism(tensor=tensor_parallel_size),
        kv_cache=False,
        attention=Attention.MEM_EFFICIENT if precision is Precision.FP32 else Attention.FLASH,
        logits=Logits.LAST,
    )


def profile_forward_bindings(
    inputs: Sequence[InputDecl], default_bindings: Mapping[str, int], tokens: int
) -> dict[str, int]:
    """The graph's bindings for ``tokens`` flattened tokens: its token input ``(batch, seq)``
    bound to ``(1, tokens)``, the other dimensions at their defaults."""
    shapes = [
        d.shape for d in inputs if len(d.shape) == 2 and all(isinstance(s, str) for s in d.shape)
    ]
    if len(shapes) != 1:
        raise ProfileGraphError(
            f"expected one token input of shape (batch, seq), found {len(shapes)}"
        )
    batch, seq = shapes[0]
    return {**default_bindings, str(batch): 1, str(seq): tokens}


def graph_forward_peak(
    inputs: Sequence[InputDecl],
    layers: Sequence[Mapping[str, Any]],
    default_bindings: Mapping[str, int],
    *,
    tokens: int,
    tensor_parallel_size: int,
    dtype: str,
) -> GraphForwardPeak:
    """The profile forward's peak of ``tokens`` tokens on one rank, from the graph [B].

    Raises
    ------
    ProfileGraphError
        No single ``(batch, seq)`` token input, or an unknown dtype; the memory engine's own
        errors (:class:`app.domain.workload.WorkloadInputError` and subclasses) pass through.
    """
    request = profile_forward_request(dtype, tensor_parallel_size)
    bindings = profile_forward_bindings(inputs, default_bindings, tokens)
    analysis = analyze_for(inputs, layers, bindings, request)
    estimate = estimate_memory(analysis, request)
    parts = {line.key: line for line in estimate.lines}
    lines = tuple((key, parts[key].bytes) for key in _FORWARD_LINES if key in parts)
    where = ""
    for key in ("transient", "activations"):
        formula = parts[key].formula if key in parts else ""
        if formula.startswith("[during"):
            where = formula[1 : formula.index("]")]
            break
    return GraphForwardPeak(
        peak_bytes=sum(b for _, b in lines),
        tokens=tokens,
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
        attention=str(request.attention),
        where=where,
        lines=lines,
    )


__all__ = [
    "GraphForwardPeak",
    "ProfileGraphError",
    "graph_forward_peak",
    "profile_forward_bindings",
    "profile_forward_request",
]
