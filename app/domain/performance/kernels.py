"""Kernels: the FLOPs and bytes each layer of an analysed graph moves at a precision (pure)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from operator import itemgetter

from app.domain.graph.analysis import GraphAnalysis, LayerAnalysis
from app.domain.graph.ops import Storage, TensorKind
from app.domain.graph.traits import CONV_OPS, FUSABLE_EPILOGUE_OPS, LOOKUP_OPS, MULTI_KERNEL_OPS
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.lazy import LazyTuple
from app.domain.performance.precision_schemes import PrecisionScheme
from app.domain.performance.tiling import Gemm, Tiling, gemm_efficiency
from app.domain.workload import FUSED_ATTENTION

INDEX_BYTES = 8  # token ids and labels are int64
FP32_BYTES = 4  # upcast softmax scores and probabilities (Storage.FP32)


@lru_cache(maxsize=1 << 16)  # bounded: a long-running server sees many shapes
def paid_gemm_flops(gemms: tuple[Gemm, ...], tiling: Tiling) -> float:
    """FLOPs of ``gemms`` as a device with ``tiling`` pays for them [FLOP]. Remembered: a
    model's blocks repeat the same few GEMM shapes, and every device of one SM count shares
    the answer (a request over every device asks for each pair hundreds of times)."""
    return sum(g.flops / gemm_efficiency(g, tiling) for g in gemms)


@lru_cache(maxsize=1 << 16)
def _gemm_flops(gemms: tuple[Gemm, ...]) -> int:
    return sum(g.flops for g in gemms)


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel:
    """One kernel: a layer with the element-wise layers fused into it.

    ``input_bytes`` are the head layer's inputs plus the other inputs of fused layers (the
    residual of an add); ``output_bytes`` the last fused layer's output; ``kv_cache_bytes`` the
    KV cache written (prefill) or read and written (decode) by an attention layer;
    ``intermediate_bytes`` the S x S scores and probabilities an unfused attention (eager,
    sdpa_math) writes to memory and reads back (0 for flash / mem_efficient).
    """

    name: str
    ops: tuple[str, ...]
    flops: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    kv_cache_bytes: int
    intermediate_bytes: int = 0
    launches: int
    gemms: tuple[Gemm, ...] = ()  # its GEMMs' shapes (empty: no tiled GEMM, e.g. a pooling)
    heads: int = 0  # attention kernels: query heads (tensor parallelism splits them)
    kv_heads: int = 0  # attention kernels: KV heads (replicated past tensor = them)

    def quantized_flops(self, tiling: Tiling | None) -> float:
        """FLOPs as the device pays for them: each GEMM's FLOPs / its wave efficiency, the
        rest (fused epilogues, softmax) as they are [FLOP]."""
        if tiling is None or not self.gemms:
            return float(self.flops)
        return paid_gemm_flops(self.gemms, tiling) + (self.flops - _gemm_flops(self.gemms))

    def unpaid_flops(self) -> int:
        """FLOPs outside its GEMMs (fused epilogues, softmax), paid as they are [FLOP]."""
        return self.flops - _gemm_flops(self.gemms)

    @property
    def bytes_moved(self) -> int:
        """Weights + inputs + outputs + KV cache + spilled intermediates [B]."""
        return (
            self.weight_bytes
            + self.input_bytes
            + self.output_bytes
            + self.kv_cache_bytes
            + self.intermediate_bytes
        )

    def dram_bytes(self, cache_share: float) -> float:
        """Bytes that reach DRAM when caches serve ``cache_share`` of the activations.

        Parameters
        ----------
        cache_share : share of activation traffic (inputs, outputs, spilled intermediates)
            served on chip [-]

        Returns
        -------
        dram : W + KV + (1 - cache_share) * (I + O + S) [B]
        """
        activations = self.input_bytes + self.output_bytes + self.intermediate_bytes
        return self.weight_bytes + self.kv_cache_bytes + (1 - cache_share) * activations

    def intensity_flops_per_byte(self, cache_share: float) -> float:
        """Operational intensity F / D: FLOPs per DRAM byte [FLOP/B]."""
        dram = self.dram_bytes(cache_share)
        return self.flops / dram if dram else math.inf


def _weight_elements(layer: LayerAnalysis) -> int:
    """Weight elements a layer reads per forward.

    A lookup (embedding) reads only the rows it gathers: one table element per output element.
    A linear layer tied to an embedding (GPT-2's LM head) owns no parameter but reads the whole
    shared matrix: its FLOPs are 2 * rows * in * out, so the matrix has FLOPs / (2 * rows).
    A mixture-of-experts layer reads the experts its tokens are routed to
    (:func:`moe_weight_elements`).
    """
    if layer.op in LOOKUP_OPS:
        return min(layer.params, layer.output_numel)
    if layer.op == "moe":
        return moe_weight_elements(layer)
    if layer.op == "linear" and not any(len(s) >= 2 for s in layer.result.param_shapes):
        rows = layer.output_numel // layer.output_shape[-1]
        return layer.params + layer.flops // (2 * rows)
    return layer.params


def expected_experts_read(experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts a step reads when ``tokens`` each pick ``top_k`` of ``experts``.

    Uniform routing: an expert is missed by one token with probability 1 - k/E, by all of them
    with (1 - k/E)^T, so E * (1 - (1 - k/E)^T) experts are read: k at one token (decode at
    batch 1), all E once the step routes enough tokens (prefill, large batches).
    """
    return experts * (1 - (1 - top_k / experts) ** tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeRouting:
    """How many experts one step of a mixture-of-experts layer reads (uniform routing).

    The ``moe`` op (Mixtral) has no shared experts; a shared expert, which every token visits,
    would be read whole at every step and belongs with the router in the always-read part.
    """

    experts: int  # E
    top_k: int  # k, experts per token
    tokens: int  # T, tokens routed in the step
    router_elements: int  # E x hidden
    expert_elements: int  # one expert's projections

    @classmethod
    def of(cls, layer: LayerAnalysis) -> MoeRouting:
        """The routing of a ``moe`` layer from its analysis (router first in its params)."""
        router = layer.result.param_shapes[0]
        experts = router[0]
        tokens = layer.output_numel // layer.output_shape[-1]
        routed = next(s.numel for s in layer.result.saved if s.label == "routing_weights")
        return cls(
            experts=experts,
            top_k=routed // tokens,
            tokens=tokens,
            router_elements=math.prod(router),
            expert_elements=(layer.params - math.prod(router)) // experts,
        )

    @property
    def experts_read(self) -> float:
        """E * (1 - (1 - k/E)^T) [-]."""
        return expected_experts_read(self.experts, self.top_k, self.tokens)

    @property
    def weight_elements(self) -> int:
        """Router + ceil(experts read x one expert's elements) [-]."""
        return self.router_elements + math.ceil(self.experts_read * self.expert_elements)

    @property
    def note(self) -> str:
        """The figure in words, with its formula and inputs (the same for every layer of one
        configuration, so that a model's notes collapse to one line per configuration)."""
        return (
            f"a mixture-of-experts layer reads the router and {self.experts_read:.3g} of "
            f"{self.experts} experts = "
            f"{self.experts} x (1 - (1 - {self.top_k}/{self.experts})^{self.tokens}) for "
            f"{self.tokens} token(s) routed top-{self.top_k} (uniform routing); FLOPs count "
            f"{self.top_k} experts per token"
        )


def moe_weight_elements(layer: LayerAnalysis) -> int:
    """Weight elements a mixture-of-experts layer reads: the router, and the experts its
    tokens are routed to (:func:`expected_experts_read`), not all of them."""
    return MoeRouting.of(layer).weight_elements


def _launches(layer: LayerAnalysis) -> int:
    if layer.op in MULTI_KERNEL_OPS:
        return 1 + sum(1 for shape in layer.result.param_shapes if len(shape) >= 2)
    return 1


SPILLED_ATTENTION_TENSORS = ("scores", "probs")  # the S x S transients of unfused attention


def _spilled_attention(layer: LayerAnalysis, context_tokens: int) -> tuple[int, int, str]:
    """(fp32 elements, activation-dtype elements, note) an attention layer spills to memory.

    eager / sdpa_math materialise the S x S scores and probabilities: the QK^T matmul writes
    the scores, the softmax reads them and writes the probabilities, the PV matmul reads those,
    so each is moved twice. With ``context_tokens`` cached (decode) every query attends to
    ``seq + context`` keys. flash / mem_efficient keep them on chip: nothing is spilled.
    """
    impl = layer.result.attention
    if impl is None or impl in FUSED_ATTENTION:
        return 0, 0, ""
    seq = layer.output_shape[1]
    fp32 = act = 0
    for transient in layer.result.transients:
        if transient.label not in SPILLED_ATTENTION_TENSORS:
            continue
        elements = 2 * transient.numel * (seq + context_tokens) // seq
        if transient.storage is Storage.FP32:
            fp32 += elements
        else:
            act += elements
    note = (
        f"{impl.value} attention writes and reads back its S x S scores and probabilities: "
        f"{fp32 + act:,} elements moved per layer ({seq} queries x {seq + context_tokens} keys "
        "per head, twice each; flash / mem_efficient keep them on chip)"
    )
    return fp32, act, note


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelCount:
    """A kernel's work in elements, independent of the precision (see :func:`count_kernels`)."""

    name: str
    ops: tuple[str, ...]
    flops: int
    weight_elements: int
    float_inputs: int  # elements read
    index_inputs: int  # int64 elements read (token ids)
    float_outputs: int
    index_outputs: int
    kv_elements: int  # KV cache elements written and read
    spilled_fp32: int = 0  # unfused attention: fp32 S x S elements written and read back
    spilled_float: int = 0  # the same at the activation dtype
    launches: int
    notes: tuple[str, ...] = ()  # what the kernel's figures assume beyond the formulas
    gemms: tuple[Gemm, ...] = ()  # GEMM shapes, for tile and wave quantization
    heads: int = 0  # attention kernels: query and KV heads
    kv_heads: int = 0

    def at(self, scheme: PrecisionScheme) -> Kernel:
        """The kernel's bytes at a precision (weights rounded up to whole bytes)."""
        act = scheme.activation_bytes
        weight = scheme.weight_bytes
        return Kernel(
            name=self.name,
            ops=self.ops,
            flops=self.flops,
            weight_bytes=-(-self.weight_elements * weight.numerator // weight.denominator),
            input_bytes=self.float_inputs * act + self.index_inputs * INDEX_BYTES,
            output_bytes=self.float_outputs * act + self.index_outputs * INDEX_BYTES,
            kv_cache_bytes=self.kv_elements * scheme.kv_cache_bytes,
            intermediate_bytes=self.spilled_fp32 * FP32_BYTES + self.spilled_float * act,
            launches=self.launches,
            gemms=self.gemms,
            heads=self.heads,
            kv_heads=self.kv_heads,
        )


PROJECTION_OPS = frozenset({"linear", "attention", "mlp"})


def layer_gemms(layer: LayerAnalysis, context_tokens: int = 0) -> tuple[Gemm, ...]:
    """The GEMMs a layer runs, for tile and wave quantization (empty for other layers).

    A convolution is its implicit GEMM: ``M = N*H_out*W_out`` output pixels, ``N`` output
    channels per group, ``K = C_in/groups * kh * kw`` (``depthwise_conv2d`` is ``C_out`` GEMMs
    of one column; ``conv2d`` with groups counts as one GEMM of all output channels, which
    understates its tiles); ``conv3d`` the same with ``M = N*D_out*H_out*W_out`` and
    ``K = C_in/groups * kd*kh*kw``. ``conv_transpose3d`` is the implicit GEMM of its
    data-gradient form: ``M`` output voxels by ``N = C_out`` over ``K = FLOPs / (2 M N)``
    (``C_in * kd*kh*kw / (sd*sh*sw)``: ``C_in`` for U-Net's kernel-2 stride-2 upsampling).
    A linear layer, and every weight matrix of an
    attention or MLP layer, is ``M = tokens`` by ``N = out`` by ``K = in``. Attention adds its
    core (QK^T, softmax, PV) as one GEMM of its output ``tokens x q_dim`` over the keys
    (FlashAttention tiles ``batch x heads x ceil(S / 128)`` query blocks: the same count at a
    head dim of 128). A ``matmul`` is ``M x N`` over ``K = FLOPs / (2 M N)``. Mixture-of-experts
    and recurrent layers are not tiled here (their FLOPs are priced without quantization).
    """
    op = layer.op
    flops = layer.flops
    if op in CONV_OPS:
        weight = layer.result.param_shapes[0]
        out = weight[0]
        m = layer.output_numel // out
        k = math.prod(weight[1:])
        if op == "depthwise_conv2d":
            return (Gemm(m=m, n=1, k=k, count=out, flops=flops),)
        if op == "conv_transpose3d":  # weight [C_in, C_out/groups, kd, kh, kw]
            n = layer.output_shape[1]
            m = layer.output_numel // n
            return (Gemm(m=m, n=n, k=max(1, flops // (2 * m * n)), count=1, flops=flops),)
        return (Gemm(m=m, n=out, k=k, count=1, flops=flops),)
    if op == "matmul":
        n = layer.output_shape[-1]
        m = layer.output_numel // n
        return (Gemm(m=m, n=n, k=max(1, flops // (2 * m * n)), count=1, flops=flops),)
    if op not in PROJECTION_OPS:
        return ()
    tokens = layer.output_numel // layer.output_shape[-1]
    matrices = [s for s in layer.result.param_shapes if len(s) == 2]
    if op == "linear" and not matrices:  # tied head: reads the shared embedding matrix
        n = layer.output_shape[-1]
        return (Gemm(m=tokens, n=n, k=flops // (2 * tokens * n), count=1, flops=flops),)
    gemms = [
        Gemm(m=tokens, n=out, k=inp, count=1, flops=2 * tokens * out * inp) for out, inp in matrices
    ]
    if op == "attention":
        core = flops + 4 * tokens * context_tokens * matrices[0][0] - sum(g.flops for g in gemms)
        keys = layer.output_shape[1] + context_tokens
        gemms.append(Gemm(m=tokens, n=matrices[0][0], k=keys, count=1, flops=max(0, core)))
    if op == "linear":
        gemms = [replace(gemms[0], flops=flops)]  # its bias adds are part of the GEMM
    return tuple(gemms)


# What a kernel takes from its head layer besides its inputs and outputs, the same for every
# repeat of a block (:func:`_head_figures`): ops, notes, FLOPs, weight elements, KV elements,
# spilled fp32 and activation-dtype elements, launches, GEMMs, query heads, KV heads
_Head = tuple[
    tuple[str, ...], tuple[str, ...], int, int, int, int, int, int, tuple[Gemm, ...], int, int
]
# A kernel as count_kernels assembles it, less its name: (index of its head's _Head, ops, FLOPs,
# weight elements, float and index elements read, float and index elements written). Plain
# ints and strings, so that grouping kernels hashes no GEMM.
_Key = tuple[int, tuple[str, ...], int, int, int, int, int, int]
# KernelCount's fields less the name and notes, in its order
_Figures = tuple[
    tuple[str, ...], int, int, int, int, int, int, int, int, int, int, tuple[Gemm, ...], int, int
]


class KernelCounts(LazyTuple[KernelCount]):
    """:func:`count_kernels`' kernels, read as a tuple of them but kept as plain rows and each
    :class:`KernelCount` built when first read: a phase is priced from one kernel per run
    (:meth:`runs`), so building a frozen object for every layer of a 96-block decoder (twice
    per batch size a search tries) would cost more than the counting."""

    __slots__ = ("_heads", "_key_runs", "_keys", "_names", "_runs")

    def __init__(
        self,
        names: tuple[str, ...],
        keys: tuple[_Key, ...],
        heads: tuple[_Head, ...],
        key_runs: Sequence[tuple[_Key, int, int]] | None = None,
    ) -> None:
        """``key_runs``: (key, first index, count) of groups of kernels of one key, covering
        them all in order of first appearance (found from ``keys`` when None)."""
        super().__init__(len(keys))
        self._names = names
        self._keys = keys
        self._heads = heads
        self._key_runs = key_runs
        self._runs: tuple[tuple[int, int], ...] | None = None

    def _figures(self, key: _Key) -> _Figures:
        head, ops, flops, weights, float_in, index_in, float_out, index_out = key
        _, _, _, _, kv, spilled_fp32, spilled_float, launches, gemms, heads, kv_heads = self._heads[
            head
        ]
        return (ops, flops, weights, float_in, index_in, float_out, index_out, kv, spilled_fp32,
                spilled_float, launches, gemms, heads, kv_heads)  # fmt: skip

    def _make(self, index: int) -> KernelCount:
        key = self._keys[index]
        head, ops, flops, weights, float_in, index_in, float_out, index_out = key
        _, notes, _, _, kv, spilled_fp32, spilled_float, launches, gemms, heads, kv_heads = (
            self._heads[head]
        )
        return KernelCount(
            name=self._names[index],
            ops=ops,
            flops=flops,
            weight_elements=weights,
            float_inputs=float_in,
            index_inputs=index_in,
            float_outputs=float_out,
            index_outputs=index_out,
            kv_elements=kv,
            spilled_fp32=spilled_fp32,
            spilled_float=spilled_float,
            launches=launches,
            notes=notes,
            gemms=gemms,
            heads=heads,
            kv_heads=kv_heads,
        )

    def runs(self) -> tuple[tuple[int, int], ...]:
        """Kernels alike in every figure but the name and notes, as (first index, count) in
        order of first appearance (found once).

        Kernels are counted per row key (C-level, no GEMM hashed), then keys whose figures are
        equal are merged (two heads of equal figures: rare, but then one run), each at its
        first kernel: the same runs as grouping every kernel by its figures.
        """
        if self._runs is not None:
            return self._runs
        key_runs = self._key_runs
        if key_runs is None:
            keys = self._keys
            # each key's first index: written last when read backwards (C-level, one pass)
            first_of = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1), strict=True))
            key_runs = [(key, first_of[key], n) for key, n in Counter(keys).items()]
        first: dict[_Figures, int] = {}
        counts: dict[_Figures, int] = {}
        for key, index, count in key_runs:
            figures = self._figures(key)
            if figures in counts:
                counts[figures] += count
            else:
                first[figures] = index
                counts[figures] = count
        self._runs = tuple((first[figures], n) for figures, n in counts.items())
        return self._runs

    def notes(self) -> tuple[str, ...]:
        """The distinct notes of the kernels, in order of first appearance."""
        heads = self._heads
        seen = dict.fromkeys(map(itemgetter(0), self._keys))  # heads in order of first use
        return tuple(dict.fromkeys(note for head in seen for note in heads[head][1]))


def count_kernels(
    analysis: GraphAnalysis,
    *,
    fuse_elementwise: bool = True,
    kv_cache: bool = False,
    kv_context_tokens: int = 0,
    kv_shared_tokens: int = 0,
    beam_width: int = 1,
) -> tuple[KernelCount, ...]:
    """Per-kernel FLOPs and elements moved of one forward pass (see :func:`build_kernels`).

    ``kv_shared_tokens`` of the ``kv_context_tokens`` are a request's prompt, shared by its
    ``beam_width`` beams (the analysis's rows are requests x beams): every beam attends to them
    (FLOPs), but they are read from memory once per request, not once per beam.
    """
    return tuple(
        kernel_counts(
            analysis,
            fuse_elementwise=fuse_elementwise,
            kv_cache=kv_cache,
            kv_context_tokens=kv_context_tokens,
            kv_shared_tokens=kv_shared_tokens,
            beam_width=beam_width,
        )
    )


def _head_figures(
    layer: LayerAnalysis,
    *,
    kv_cache: bool,
    kv_context_tokens: int,
    kv_shared_tokens: int,
    beam_width: int,
) -> _Head:
    """What a kernel headed by ``layer`` takes from it besides its inputs and outputs: ops,
    notes, FLOPs, weight elements, KV elements, spilled fp32 and activation-dtype elements,
    launches, GEMMs, query and KV heads. It depends on the layer's op result only (which fixes
    its op and output shape), so the repeats of a block, which share their op results, share
    it."""
    result = layer.result
    op = layer.op
    flops = result.flops
    notes: tuple[str, ...] = ()
    if op == "moe":
        notes = (MoeRouting.of(layer).note,)
    kv = 0
    context = 0
    if kv_cache and op == "attention" and result.kv_cache_numel:
        kv = result.kv_cache_numel  # this step's keys and values
        if kv_context_tokens:
            context = kv_context_tokens
            per_token = result.kv_cache_numel // layer.output_shape[1]
            kv += (
                per_token * context - per_token * kv_shared_tokens * (beam_width - 1) // beam_width
            )
            tokens = layer.output_numel // layer.output_shape[-1]
            flops += 4 * tokens * context * result.param_shapes[0][0]
    spilled_fp32 = spilled_float = 0
    if op == "attention":
        spilled_fp32, spilled_float, note = _spilled_attention(layer, context)
        notes = (note,) if note else notes
    return (
        (op,),
        notes,
        flops,
        _weight_elements(layer),
        kv,
        spilled_fp32,
        spilled_float,
        _launches(layer),
        layer_gemms(layer, context),
        result.num_heads,
        result.num_kv_heads,
    )


def check_shared_tokens(kv_context_tokens: int, kv_shared_tokens: int) -> None:
    """Refuse shared prompt tokens beyond the context (:func:`count_kernels`)."""
    if not 0 <= kv_shared_tokens <= kv_context_tokens:
        raise RooflineInputError(
            f"kv_shared_tokens must be in [0, kv_context_tokens {kv_context_tokens}], "
            f"got {kv_shared_tokens}"
        )


def kernel_counts(
    analysis: GraphAnalysis,
    *,
    fuse_elementwise: bool = True,
    kv_cache: bool = False,
    kv_context_tokens: int = 0,
    kv_shared_tokens: int = 0,
    beam_width: int = 1,
) -> KernelCounts:
    """:func:`count_kernels`, its kernels built when read (:class:`KernelCounts`).

    A kernel's figures other than its inputs and outputs come from its head layer's op result
    (:func:`_head_figures`, found once per result); a fused layer adds its FLOPs, weights and
    other inputs, and its output replaces the kernel's.
    """
    check_shared_tokens(kv_context_tokens, kv_shared_tokens)
    index_kind = TensorKind.INDEX
    fusable = FUSABLE_EPILOGUE_OPS if fuse_elementwise else frozenset[str]()
    nothing = (0, 0)
    # storage -> (float elements, index elements) of the value it holds
    elements: dict[int, tuple[int, int]] = {
        item.storage: (0, item.numel) if item.kind is index_kind else (item.numel, 0)
        for item in analysis.inputs
    }
    head_of: dict[int, int] = {}  # id(OpResult) -> index in heads
    heads: list[_Head] = []
    names: list[str] = []
    keys: list[_Key] = []
    add_key = keys.append
    open_storage: int | None = None  # output storage of the last kernel, while fusable
    # the kernel being assembled (fused layers are added to it)
    head = 0
    ops: tuple[str, ...] = ()
    flops = weights = float_in = index_in = float_out = index_out = 0
    for layer in analysis.layers:
        name, op, _, storages, _, kind, storage, _, result, numel = layer
        out = (0, numel) if kind is index_kind else (numel, 0)
        # views and inference-time identities (dropout) launch nothing and move nothing
        if result.alias_of is not None and result.flops == 0:
            elements[storage] = out
            continue
        if open_storage is not None and op in fusable and open_storage in storages:
            chained = storages.index(open_storage)
            ops = (*ops, op)
            flops += result.flops
            weights += result.params
            for position, source in enumerate(storages):
                if position != chained:
                    f, i = elements.get(source, nothing)
                    float_in += f
                    index_in += i
        else:
            if open_storage is not None:
                add_key((head, ops, flops, weights, float_in, index_in, float_out, index_out))
            found = head_of.get(id(result))
            if found is None:
                found = head_of[id(result)] = len(heads)
                heads.append(
                    _head_figures(
                        layer,
                        kv_cache=kv_cache,
                        kv_context_tokens=kv_context_tokens,
                        kv_shared_tokens=kv_shared_tokens,
                        beam_width=beam_width,
                    )
                )
            head = found
            ops, _, flops, weights = heads[found][:4]
            names.append(name)
            if len(storages) == 1:
                float_in, index_in = elements.get(storages[0], nothing)
            else:
                float_in = index_in = 0
                for source in storages:
                    f, i = elements.get(source, nothing)
                    float_in += f
                    index_in += i
        float_out, index_out = out
        elements[storage] = out
        open_storage = storage
    if open_storage is not None:
        add_key((head, ops, flops, weights, float_in, index_in, float_out, index_out))
    return KernelCounts(tuple(names), tuple(keys), tuple(heads))


def build_kernels(
    analysis: GraphAnalysis,
    scheme: PrecisionScheme,
    *,
    fuse_elementwise: bool = True,
    kv_cache: bool = False,
    kv_context_tokens: int = 0,
) -> tuple[Kernel, ...]:
    """Per-kernel FLOPs and bytes moved of one forward pass at a precision.

    Parameters
    ----------
    analysis : the graph analysed in inference mode (``analyze(..., training=False)``), with
        the attention implementation the request runs (``analyze(attention=...)``)
    scheme : bytes per weight, activation and KV-cache element
    fuse_elementwise : fuse batchnorm, activations and adds into the kernel that produced
        their input (the inference engines' epilogue fusion); else every layer is a kernel
    kv_cache : decoders: attention layers write their keys and values to the KV cache
    kv_context_tokens : decode steps: tokens already in the cache, which every attention
        layer reads and attends to

    Returns
    -------
    kernels : in execution order

    Notes
    -----
    Bytes moved by a layer = weight bytes + input bytes + output bytes, with weights at
    ``scheme.weight_bytes`` per element (embeddings: only the gathered rows; tied heads: the
    shared matrix; mixture-of-experts: the router and the ``E * (1 - (1 - k/E)^T)`` experts
    its ``T`` tokens are routed to), float tensors at ``scheme.activation_bytes`` and token ids
    at 8 B. The intermediates inside a composite layer (q/k/v in attention, the MLP's wide
    activation) are assumed to stay on chip, as fused kernels keep them; so are attention's
    S x S scores with flash / mem_efficient, while eager / sdpa_math write the scores and
    probabilities and read them back (``intermediate_bytes``: 2 x (scores + probabilities) at
    their fp32 storage). A fused layer adds its FLOPs and weights to the kernel, reads only its
    other inputs, and its output replaces the kernel's output (the intermediate is never
    written). Decode steps add, per attention layer, the KV cache read
    ``2 * b * c * kv_dim * scheme.kv_cache_bytes`` and the attention FLOPs over the cache
    ``4 * b * c * q_dim`` (QK^T and PV; softmax FLOPs left out).
    """
    counts = count_kernels(
        analysis,
        fuse_elementwise=fuse_elementwise,
        kv_cache=kv_cache,
        kv_context_tokens=kv_context_tokens,
    )
    return tuple(count.at(scheme) for count in counts)
