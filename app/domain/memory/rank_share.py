"""What one rank of a tensor x pipeline-parallel group holds of a model: the pipeline stage of
every layer (vLLM's split of the repeated blocks), the weights of each stage split over the
tensor-parallel ranks with the K/V projections of replicated KV heads, the KV cache per rank,
and the stage that holds the most (the per-device figure). Rules from :mod:`app.domain.parallel`;
bytes per weight from :mod:`app.domain.memory.formulas`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from app.domain.graph.analysis import GraphAnalysis, LayerAnalysis
from app.domain.memory.formulas import PrecisionPlan, ceil_fraction, weights_bytes
from app.domain.memory.memo import PlanMemo, memoised, op_groups, op_result_groups
from app.domain.memory.request import MemoryRequest
from app.domain.parallel import (
    check_tensor_parallel,
    kv_heads_per_rank,
    pipeline_stage_layers,
)
from app.domain.precision import Precision, bytes_per_element, convention
from app.domain.quantization import CheckpointLayout
from app.domain.workload import Mode


def repeated_block(name: str) -> str | None:
    """The repeated block a layer belongs to: ``layers.3.attn`` -> ``layers.3`` (None: outside
    every repeated block). The blocks are the decoder layers pipeline stages split."""
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return f"{parts[0]}.{parts[1]}"
    return None


def attention_heads(analysis: GraphAnalysis) -> tuple[tuple[str, int, int], ...]:
    """Each distinct attention layer's (name, query heads, KV heads), first occurrence only."""
    seen: dict[tuple[int, int], str] = {}
    for layer in analysis.layers:
        heads, kv_heads = layer.result.num_heads, layer.result.num_kv_heads
        if layer.op == "attention" and heads and (heads, kv_heads) not in seen:
            seen[heads, kv_heads] = layer.name
    return tuple((name, heads, kv) for (heads, kv), name in seen.items())


def check_tensor_parallel_heads(analysis: GraphAnalysis, tp: int) -> None:
    """Raise :class:`app.domain.parallel.TensorParallelError` when ``tp`` cannot split an
    attention layer's heads (:func:`app.domain.parallel.check_tensor_parallel`)."""
    if tp < 2:
        return
    for name, heads, kv_heads in attention_heads(analysis):
        check_tensor_parallel(heads, kv_heads, tp, layer=name)


def layer_stages(analysis: GraphAnalysis, pp: int) -> tuple[int, ...] | None:
    """The pipeline stage of every layer, or None when the graph has no repeated block to split
    (then every stage is charged ``1 / pp`` of the model, the rule before stages).

    The repeated blocks are split as :func:`app.domain.parallel.pipeline_stage_layers` says
    (vLLM's ``get_pp_indices``); the layers before the first block (the embeddings) are on the
    first stage, those after the last block (final norm, output head) on the last, a layer
    between blocks on the stage of the block before it.
    """
    if pp < 2:
        return None
    blocks = list(
        dict.fromkeys(b for layer in analysis.layers if (b := repeated_block(layer.name)))
    )
    if not blocks:
        return None
    stage_of: dict[str, int] = {}
    start = 0
    for stage, count in enumerate(pipeline_stage_layers(len(blocks), pp)):
        for name in blocks[start : start + count]:
            stage_of[name] = stage
        start += count
    stages: list[int] = []
    current = 0
    for layer in analysis.layers:
        block = repeated_block(layer.name)
        if block is not None:
            current = stage_of[block]
        stages.append(current)
    last_block = max(i for i, layer in enumerate(analysis.layers) if repeated_block(layer.name))
    for i in range(last_block + 1, len(stages)):
        stages[i] = pp - 1
    return tuple(stages)


def tied_weight_numel(layer: LayerAnalysis) -> int:
    """Elements of the weight a linear layer tied to an earlier one reads (0: not tied)."""
    if layer.op != "linear" or any(len(s) == 2 for s in layer.result.param_shapes):
        return 0
    out = layer.output_shape[-1] if layer.output_shape else 0
    rows = layer.output_numel // out if out else 0
    return layer.result.flops // (2 * rows) if rows else 0


def _kv_replicated_elements(layer: LayerAnalysis, tp: int) -> Fraction:
    """Weight elements one rank holds beyond ``1 / tp`` of an attention layer because its KV
    heads are replicated (``tp`` > KV heads): K and V projections (and biases) of
    ``kv_heads_per_rank`` heads each instead of ``kv_heads / tp`` [elements]."""
    result = layer.result
    kv_heads = result.num_kv_heads
    if layer.op != "attention" or not kv_heads or tp <= kv_heads:
        return Fraction(0)
    kv_dim, hidden = result.param_shapes[1]
    head_dim = kv_dim // kv_heads
    per_row = hidden + (1 if len(result.param_shapes) >= 7 else 0)  # + the k/v bias
    extra_rows = Fraction(kv_heads_per_rank(kv_heads, tp) * head_dim) - Fraction(kv_dim, tp)
    return 2 * extra_rows * per_row


def kv_rank_numel(layer: LayerAnalysis, tp: int) -> int:
    """KV cache elements one rank of a ``tp``-way group holds for ``layer`` [elements]:
    ``kv_cache_numel / kv_heads x kv_heads_per_rank(kv_heads, tp)``."""
    result = layer.result
    kv, kv_heads = result.kv_cache_numel, result.num_kv_heads
    if not kv or not kv_heads:
        return -(-kv // tp)  # ceil(kv / tp), in integers
    return kv // kv_heads * kv_heads_per_rank(kv_heads, tp)


def _layers_share(groups: Iterable[tuple[LayerAnalysis, int]], tp: int) -> tuple[Fraction, int]:
    """The sums of :func:`_kv_replicated_elements` and :func:`kv_rank_numel` over layers, each
    evaluated once per distinct (op, op result) (``groups``: :func:`op_result_groups`; the
    repeats of a block share their results) and multiplied by its count (speed only)."""
    extra_total = Fraction(0)
    kv_total = 0
    for layer, count in groups:
        extra = _kv_replicated_elements(layer, tp)
        if extra:
            extra_total += count * extra
        kv_total += count * kv_rank_numel(layer, tp)
    return extra_total, kv_total


@dataclass(frozen=True, slots=True, kw_only=True)
class StageShare:
    """What each rank of one pipeline stage holds.

    ``stored``: the stage's weights, unsharded [B]; ``replicated``: weight elements a rank
    holds beyond ``1 / tp`` of them for KV heads replicated over the tensor-parallel group
    [elements]; ``weights``: ``ceil(stored / tp + replicated x bytes per weight)`` [B];
    ``kv_numel``: KV cache elements per rank [elements]; ``blocks``: repeated blocks [-].
    """

    stored: int
    replicated: Fraction
    weights: int
    kv_numel: int
    blocks: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RankShare:
    """What one rank of a tensor x pipeline group holds of the model: per pipeline stage, and
    which stage holds the most weights + KV cache (``worst``: the per-device figure)."""

    stages: tuple[StageShare, ...]
    worst: int
    staged: bool  # False: no repeated block, every stage charged 1 / pp of the model

    @property
    def weights(self) -> int:
        """Weight bytes on the worst stage's ranks [B]."""
        return self.stages[self.worst].weights

    @property
    def kv_numel(self) -> int:
        """KV cache elements on the worst stage's ranks [elements]."""
        return self.stages[self.worst].kv_numel


def rank_share(
    analysis: GraphAnalysis,
    plan: PrecisionPlan,
    precision: Precision,
    weights_full: int,
    tp: int,
    pp: int,
    kv_bytes: int,
    checkpoint: CheckpointLayout | None = None,
    groups: list[tuple[LayerAnalysis, int]] | None = None,
) -> RankShare:
    """The weights and KV cache one rank holds under tensor ``tp`` x pipeline ``pp``.

    Parameters
    ----------
    analysis, plan, precision : the model and its bytes per weight
    weights_full : int
        The whole model's stored weights (:func:`weights_bytes`) [B].
    tp, pp : int
        Tensor- and pipeline-parallel degrees [-].
    kv_bytes : int
        Bytes per KV cache element, to rank the stages (0: no KV cache) [B].
    groups : list of (LayerAnalysis, int), optional
        The analysis's :func:`op_result_groups`, if known.

    Notes
    -----
    Per stage: ``ceil(stage weights / tp + replicated x bytes per weight)``, ``replicated``
    the K/V projection rows (and biases) of attention layers whose KV heads are fewer than
    ``tp`` (:func:`_kv_replicated_elements`); the last stage also holds a copy of a tied output
    head's embedding (vLLM builds ``embed_tokens`` on the last rank when
    ``tie_word_embeddings``). KV cache per stage: :func:`kv_rank_numel` summed over the stage's
    attention layers. Without a repeated block every stage is charged
    ``ceil(weights / (tp x pp) + replicated x bytes / pp)`` and ``ceil(KV / pp)``.
    """
    stages_of = layer_stages(analysis, pp)
    if stages_of is None:
        extra, kv = _layers_share(groups or op_result_groups(analysis.layers), tp)
        weights = ceil_fraction(Fraction(weights_full, tp * pp) + extra * plan.weight / pp)
        share = StageShare(
            stored=weights_full,
            replicated=extra,
            weights=weights,
            kv_numel=kv if pp == 1 else ceil_fraction(Fraction(kv, pp)),
            blocks=0,
        )
        return RankShare(stages=(share,) * pp, worst=0, staged=False)
    members: list[list[int]] = [[] for _ in range(pp)]
    for index, stage in enumerate(stages_of):
        members[stage].append(index)
    blocks = pipeline_stage_layers(
        len({b for layer in analysis.layers if (b := repeated_block(layer.name))}), pp
    )
    embedding_of: dict[int, int] = {}
    for index, layer in enumerate(analysis.layers):
        if layer.op == "embedding" and stages_of[index] != pp - 1:
            embedding_of.setdefault(layer.result.params, index)
    stages: list[StageShare] = []
    for stage, indices in enumerate(members):
        held = set(indices)
        if stage == pp - 1:
            for index in indices:
                tied = embedding_of.get(tied_weight_numel(analysis.layers[index]))
                if tied is not None:
                    held.add(tied)  # the tied head's weight: a copy on the last stage
        stored = weights_bytes(analysis, plan, precision, held, checkpoint)[0] if held else 0
        extra, kv = _layers_share(op_result_groups([analysis.layers[i] for i in indices]), tp)
        stages.append(
            StageShare(
                stored=stored,
                replicated=extra,
                weights=ceil_fraction(Fraction(stored, tp) + extra * plan.weight),
                kv_numel=kv,
                blocks=blocks[stage],
            )
        )
    worst = max(range(pp), key=lambda s: stages[s].weights + stages[s].kv_numel * kv_bytes)
    return RankShare(stages=tuple(stages), worst=worst, staged=True)


def request_rank_share(
    analysis: GraphAnalysis,
    request: MemoryRequest,
    plan: PrecisionPlan,
    plans: PlanMemo | None,
) -> tuple[RankShare, int, tuple[str, ...]]:
    """:func:`rank_share` for ``request`` (memoised per analysis, precision, degrees and KV
    cache), with the unsharded weight bytes and their notes."""
    precision, par, checkpoint = request.precision, request.parallelism, request.checkpoint
    weights_full, notes = memoised(
        plans,
        analysis,
        ("weights bytes", precision, checkpoint),
        lambda: weights_bytes(analysis, plan, precision, None, checkpoint),
    )
    kv_bytes = 0
    if request.mode is Mode.INFERENCE and analysis.is_decoder and request.kv_cache is not False:
        kv_bytes = int(bytes_per_element(convention(precision).kv_cache_dtype))
    degrees = (par.tensor, par.pipeline, kv_bytes, checkpoint)
    share = memoised(
        plans,
        analysis,
        ("rank share", precision, *degrees),
        lambda: rank_share(
            analysis, plan, precision, weights_full, *degrees, op_groups(plans, analysis)
        ),
    )
    return share, weights_full, notes
