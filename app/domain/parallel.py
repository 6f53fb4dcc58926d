"""What a tensor- or pipeline-parallel rank holds: the ONE set of rules the memory engine and
the speed side (:mod:`app.domain.performance.tensor_parallel`) read.

Tensor parallelism (Megatron-style, as vLLM runs it): the attention heads and the MLP columns
are split over the ``tp`` ranks of a group (column-parallel QKV / gate / up projections,
row-parallel output / down projections followed by an all-reduce); the KV heads are split too,
and replicated when the group has more ranks than KV heads, so that every rank holds at least
one. Pipeline parallelism: the decoder layers are split into ``pp`` consecutive stages; the
first stage also holds the input embedding, the last the final norm and the output head.

References
----------
Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", 2019 (column- and row-parallel linears, one all-reduce per row-parallel output).
vLLM 0.19, vllm/config/model.py: ``ModelConfig.verify_with_parallel_config`` ("Total number of
attention heads (...) must be divisible by tensor parallel size (...)") and
``ModelConfig.get_num_kv_heads`` (``max(1, total_num_kv_heads // tensor_parallel_size)``: "We
will replicate the KV heads in the case where the number of KV heads is smaller than the tensor
parallel size so each GPU has at least one KV head").
vLLM 0.19, vllm/model_executor/layers/linear.py: ``QKVParallelLinear`` (``divide(tp_size,
total_num_kv_heads)`` replicas when ``tp_size >= total_num_kv_heads``, else
``divide(total_num_kv_heads, tp_size)`` heads per rank; ``divide`` asserts divisibility).
vLLM 0.19, vllm/distributed/utils.py: ``get_pp_indices`` (the decoder layers per stage).
"""

from __future__ import annotations

from app.domain.workload import WorkloadInputError


class TensorParallelError(WorkloadInputError):
    """A tensor-parallel degree the model's attention heads cannot be split over (vLLM refuses
    to start with it). ``heads``/``kv_heads``: the model's; ``tensor``: the degree asked."""

    field = "parallelism.tensor"

    def __init__(self, message: str, *, heads: int, kv_heads: int, tensor: int) -> None:
        super().__init__(message)
        self.heads = heads
        self.kv_heads = kv_heads
        self.tensor = tensor


def check_tensor_parallel(heads: int, kv_heads: int, tp: int, *, layer: str = "") -> None:
    """Refuse a tensor-parallel degree ``tp`` that an attention layer's heads cannot be split
    over, as vLLM does at start-up.

    Parameters
    ----------
    heads : int
        Query (attention) heads of the layer [-].
    kv_heads : int
        Key/value heads of the layer [-] (``heads`` for MHA, fewer for GQA, 1 for MQA).
    tp : int
        Ranks of the tensor-parallel group [-].
    layer : str
        The layer's name, for the message.

    Raises
    ------
    TensorParallelError
        When ``heads % tp != 0`` (``verify_with_parallel_config``), or when the KV heads can
        neither be split evenly (``tp < kv_heads`` and ``kv_heads % tp != 0``) nor replicated
        evenly (``tp >= kv_heads`` and ``tp % kv_heads != 0``) (``QKVParallelLinear``).
    """
    where = f" (layer '{layer}')" if layer else ""
    if heads % tp:
        raise TensorParallelError(
            f"tensor parallelism {tp} does not divide the model's {heads} attention heads{where}: "
            f"each rank must hold whole heads (vLLM refuses it: 'Total number of attention heads "
            f"({heads}) must be divisible by tensor parallel size ({tp})'); use a degree that "
            f"divides {heads}",
            heads=heads,
            kv_heads=kv_heads,
            tensor=tp,
        )
    if (tp < kv_heads and kv_heads % tp) or (tp >= kv_heads and tp % kv_heads):
        raise TensorParallelError(
            f"tensor parallelism {tp} can neither split nor evenly replicate the model's "
            f"{kv_heads} KV heads{where} (vLLM's QKVParallelLinear requires {kv_heads} % {tp} "
            f"== 0, or {tp} % {kv_heads} == 0 when {tp} >= {kv_heads})",
            heads=heads,
            kv_heads=kv_heads,
            tensor=tp,
        )


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """KV heads each rank of a ``tp``-way tensor-parallel group caches and projects [-]:
    ``max(1, kv_heads // tp)`` (vLLM's ``ModelConfig.get_num_kv_heads``): split when the group
    is no larger than the KV heads, one replicated head per rank when it is larger."""
    if kv_heads < 1 or tp < 1:
        raise ValueError(f"kv_heads and tp must be >= 1, got {kv_heads}, {tp}")
    return max(1, kv_heads // tp)


def pipeline_stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers on each of ``pp`` pipeline stages, first to last [layers].

    ``layers // pp`` each; the remainder ``r`` goes one layer each to the ``r`` stages before the
    last (the last holds the final norm and the output head), as vLLM's ``get_pp_indices``
    (without ``VLLM_PP_LAYER_PARTITION``) splits them: 30 layers over 4 stages are
    ``(7, 8, 8, 7)``, 32 are ``(8, 8, 8, 8)``. Stages may be empty when ``pp > layers``.
    """
    if layers < 0 or pp < 1:
        raise ValueError(f"layers must be >= 0 and pp >= 1, got {layers}, {pp}")
    partitions = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        partitions[-i] += 1
    return tuple(partitions)
