"""Architecture graph format: op vocabulary, attribute rules and structural validation.

A model is a list of layers. Each layer is a mapping with a unique ``name``, an ``op`` and the
op's attributes. Layers run in order and take the previous layer's output unless they name
``inputs`` (earlier layers or declared model inputs), which makes every graph acyclic by
construction. ``block`` groups layers; ``repeat`` repeats its ``layers`` ``times`` times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.errors import GraphError

MAX_DIM = 2**40
MAX_DEPTH = 8
MAX_LAYERS = 100_000

Check = Callable[[Any], str | None]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: Any) -> str | None:
    """Accept an integer in [1, 2^40]."""
    if not _is_int(value) or not 1 <= value <= MAX_DIM:
        return "must be a positive integer"
    return None


def non_negative_int(value: Any) -> str | None:
    """Accept an integer in [0, 2^40]."""
    if not _is_int(value) or not 0 <= value <= MAX_DIM:
        return "must be a non-negative integer"
    return None


def any_int(value: Any) -> str | None:
    """Accept any integer (dimension indices may be negative)."""
    return None if _is_int(value) and abs(value) <= 64 else "must be an integer in [-64, 64]"


def signed_int(value: Any) -> str | None:
    """Accept an integer in [-2^40, 2^40] (slice bounds)."""
    return None if _is_int(value) and abs(value) <= MAX_DIM else "must be an integer"


def identifier(value: Any) -> str | None:
    """Accept a short name such as an ONNX op type (letters, digits, '_', '.', '-')."""
    ok = (
        isinstance(value, str)
        and 0 < len(value) <= 64
        and value.replace("_", "a").replace(".", "a").replace("-", "a").isalnum()
        and value.isascii()
    )
    return None if ok else "must be a name of letters, digits, '_', '.' or '-' (max 64 chars)"


def boolean(value: Any) -> str | None:
    """Accept true/false."""
    return None if isinstance(value, bool) else "must be true or false"


def positive_number(value: Any) -> str | None:
    """Accept a number > 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return None if ok else "must be a number > 0"


def probability(value: Any) -> str | None:
    """Accept a number in [0, 1)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1
    return None if ok else "must be a number in [0, 1)"


def _pair_of(check: Check, what: str) -> Check:
    def run(value: Any) -> str | None:
        if isinstance(value, list) and len(value) == 2:
            return None if all(check(v) is None for v in value) else f"must be {what} or a pair"
        return None if check(value) is None else f"must be {what} or a pair"

    return run


positive_pair = _pair_of(positive_int, "a positive integer")
non_negative_pair = _pair_of(non_negative_int, "a non-negative integer")


def _triple_of(check: Check, what: str) -> Check:
    def run(value: Any) -> str | None:
        if isinstance(value, list):
            if len(value) == 3 and all(check(v) is None for v in value):
                return None
            return f"must be {what} or a list of 3 (depth, height, width)"
        return None if check(value) is None else f"must be {what} or a list of 3"

    return run


positive_triple = _triple_of(positive_int, "a positive integer")
non_negative_triple = _triple_of(non_negative_int, "a non-negative integer")


def padding(value: Any) -> str | None:
    """Accept a non-negative int, a pair, or 'same' / 'valid'."""
    if value in ("same", "valid"):
        return None
    return None if non_negative_pair(value) is None else "must be 'same', 'valid', int or pair"


def padding3d(value: Any) -> str | None:
    """Accept a non-negative int, a list of 3, or 'same' / 'valid'."""
    if value in ("same", "valid"):
        return None
    if non_negative_triple(value) is None:
        return None
    return "must be 'same', 'valid', a non-negative integer or a list of 3"


def one_of(*choices: str) -> Check:
    """Accept one of ``choices``."""

    def run(value: Any) -> str | None:
        return None if value in choices else "must be one of: " + ", ".join(choices)

    return run


def layer_name(value: Any) -> str | None:
    """Accept a layer name (checked against earlier layers later)."""
    return None if isinstance(value, str) and value else "must be a layer name"


def fixed_shape(value: Any) -> str | None:
    """Accept a list of positive ints (at most 8), or [] for a scalar."""
    if not isinstance(value, list) or len(value) > 8:
        return "must be a list of at most 8 positive integers"
    return None if all(positive_int(d) is None for d in value) else "must be positive integers"


def shape(value: Any) -> str | None:
    """Accept a list of positive ints, -1 (inferred) or dimension symbols."""
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of dimensions"
    for dim in value:
        if isinstance(dim, str):
            if not dim.isidentifier():
                return f"symbol {dim!r} is not an identifier"
        elif not (_is_int(dim) and (dim == -1 or 1 <= dim <= MAX_DIM)):
            return "dimensions must be positive integers, -1 or symbols"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSpec:
    """Attribute rules of one op."""

    required: Mapping[str, Check] = field(default_factory=dict)
    optional: Mapping[str, Check] = field(default_factory=dict)
    min_inputs: int = 1
    max_inputs: int | None = 1
    nested: bool = False


# Element-wise functions of the ``elementwise`` op (numpy broadcasting over every input).
ELEMENTWISE_FUNCTIONS = (
    "abs", "add", "ceil", "clip", "cos", "div", "elu", "erf", "exp", "floor", "hardsigmoid",
    "hardswish", "identity", "leaky_relu", "log", "max", "min", "mish", "mul", "neg", "pow",
    "reciprocal", "round", "rsqrt", "sign", "sin", "softplus", "sqrt", "sub", "where",
)  # fmt: skip
REDUCE_FUNCTIONS = ("mean", "sum", "max", "min", "prod", "l1", "l2", "sum_square", "log_sum_exp")
_MLP_ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_new", "relu", "silu", "swiglu", "geglu")


_ACT = {"inplace": boolean}
_CONV = {
    "stride": positive_pair,
    "padding": padding,
    "dilation": positive_pair,
    "bias": boolean,
    "in_channels": positive_int,
}
# 3-d convolutions (direct and transposed): the options they share
_CONV3D_REQUIRED = {"out_channels": positive_int, "kernel_size": positive_triple}
_CONV3D = {
    "stride": positive_triple,
    "dilation": positive_triple,
    "groups": positive_int,
    "bias": boolean,
    "in_channels": positive_int,
}

OP_SPECS: Mapping[str, OpSpec] = {
    "conv2d": OpSpec(
        required={"out_channels": positive_int, "kernel_size": positive_pair},
        # batchnorm_folded: an eval-mode export may have folded a batch norm into this
        # convolution (the ONNX importer's finding); training estimates say they cannot see it
        optional={**_CONV, "groups": positive_int, "batchnorm_folded": boolean},
    ),
    "depthwise_conv2d": OpSpec(
        required={"kernel_size": positive_pair},
        optional={**_CONV, "channel_multiplier": positive_int},
    ),
    "pointwise_conv2d": OpSpec(
        required={"out_channels": positive_int},
        optional={"stride": positive_pair, "bias": boolean, "in_channels": positive_int},
    ),
    "conv3d": OpSpec(required=_CONV3D_REQUIRED, optional={**_CONV3D, "padding": padding3d}),
    "conv_transpose3d": OpSpec(
        required=_CONV3D_REQUIRED,
        optional={
            **_CONV3D,
            "padding": non_negative_triple,
            "output_padding": non_negative_triple,
        },
    ),
    "maxpool2d": OpSpec(
        required={"kernel_size": positive_pair},
        optional={"stride": positive_pair, "padding": non_negative_pair, "ceil_mode": boolean},
    ),
    "avgpool2d": OpSpec(
        required={"kernel_size": positive_pair},
        optional={"stride": positive_pair, "padding": non_negative_pair, "ceil_mode": boolean},
    ),
    "adaptive_avgpool2d": OpSpec(required={"output_size": positive_pair}),
    "adaptive_maxpool2d": OpSpec(required={"output_size": positive_pair}),
    "batchnorm2d": OpSpec(
        optional={"eps": positive_number, "momentum": probability, "affine": boolean}
    ),
    "instancenorm3d": OpSpec(optional={"eps": positive_number, "affine": boolean}),
    "layernorm": OpSpec(
        optional={"eps": positive_number, "elementwise_affine": boolean, "bias": boolean}
    ),
    "rmsnorm": OpSpec(optional={"eps": positive_number}),
    "relu": OpSpec(optional=_ACT),
    "relu6": OpSpec(optional=_ACT),
    "gelu": OpSpec(optional={**_ACT, "approximate": one_of("none", "tanh")}),
    "silu": OpSpec(optional=_ACT),
    "tanh": OpSpec(optional=_ACT),
    "sigmoid": OpSpec(optional=_ACT),
    "dropout": OpSpec(optional={"p": probability, "inplace": boolean}),
    "linear": OpSpec(
        required={"out_features": positive_int},
        optional={"bias": boolean, "in_features": positive_int, "tied_to": layer_name},
    ),
    "flatten": OpSpec(optional={"start_dim": any_int, "end_dim": any_int}),
    "reshape": OpSpec(required={"shape": shape}),
    "transpose": OpSpec(required={"dim0": any_int, "dim1": any_int}),
    "select": OpSpec(required={"dim": any_int, "index": any_int}),
    "add": OpSpec(optional={"inplace": boolean}, min_inputs=2, max_inputs=None),
    "concat": OpSpec(optional={"dim": any_int}, min_inputs=2, max_inputs=None),
    "embedding": OpSpec(
        required={"num_embeddings": positive_int, "embedding_dim": positive_int},
        optional={"padding_idx": non_negative_int, "tied_to": layer_name},
    ),
    "embedding_add": OpSpec(
        required={"num_embeddings": positive_int}, optional={"positional": boolean}
    ),
    "cls_token": OpSpec(),
    "attention": OpSpec(
        required={"num_heads": positive_int},
        optional={
            "num_kv_heads": positive_int,
            "head_dim": positive_int,
            "hidden_size": positive_int,
            "causal": boolean,
            "qkv_bias": boolean,
            "out_bias": boolean,
            "rotary": boolean,
            "dropout": probability,
            # a causal layer attending to the last sliding_window tokens (Mistral, Gemma-2/3,
            # gpt-oss sliding layers): its KV cache holds at most that many tokens a sequence
            "sliding_window": positive_int,
            "sinks": boolean,  # one learned attention-sink logit a head (gpt-oss)
            # GPT-NeoX as transformers wrote it in mid-2024 (app/domain/graph/ops/transformer.py):
            # q/k/v views of one fused output, fp32 rotary, registered mask and rotary buffers
            "fused_qkv": boolean,
            "rotary_fp32": boolean,
            # q, k and v from one projection (GPT-2's c_attn, BLOOM's query_key_value): under
            # CUDA autocast one 16-bit cast of the input is kept, not three (ops/transformer.py)
            "fused_qkv_projection": boolean,
            "buffer_positions": positive_int,
            "rotary_dims": positive_int,
            # multi-head latent attention (DeepSeek-V2/V3): present with kv_lora_rank
            "kv_lora_rank": positive_int,
            "q_lora_rank": positive_int,
            "qk_nope_head_dim": positive_int,
            "qk_rope_head_dim": positive_int,
            "v_head_dim": positive_int,
        },
    ),
    "mlp": OpSpec(
        required={"intermediate_size": positive_int},
        optional={
            "activation": one_of(*_MLP_ACTIVATIONS),
            "bias": boolean,
            # gate and up from one projection (Phi-3's gate_up_proj): under CUDA autocast one
            # 16-bit cast of the input is kept, not two (ops/transformer.py)
            "fused_gate_up_projection": boolean,
        },
    ),
    "moe": OpSpec(
        required={
            "num_experts": positive_int,
            "experts_per_token": positive_int,
            "intermediate_size": positive_int,
        },
        optional={
            "activation": one_of(*_MLP_ACTIVATIONS),
            "bias": boolean,
            # a shared expert every token goes through (DeepSeek, Qwen2-MoE, Llama-4): one MLP
            # of this width (DeepSeek's n_shared_experts x moe_intermediate_size)
            "shared_intermediate_size": positive_int,
            "shared_expert_gate": boolean,  # Qwen2-MoE: a 1-output sigmoid gate on it
            "router_bias": boolean,  # gpt-oss: the router linear has a bias
        },
    ),
    "matmul": OpSpec(min_inputs=2, max_inputs=2),
    "elementwise": OpSpec(required={"function": one_of(*ELEMENTWISE_FUNCTIONS)}, max_inputs=None),
    "reduce": OpSpec(
        required={"dim": any_int},
        optional={"keepdim": boolean, "function": one_of(*REDUCE_FUNCTIONS)},
    ),
    "slice": OpSpec(
        required={"dim": any_int, "start": signed_int, "end": signed_int},
        optional={"step": positive_int},
    ),
    "tensor": OpSpec(
        required={"shape": fixed_shape},
        optional={"trainable": boolean, "output_shape": shape},
        min_inputs=0,
        max_inputs=0,
    ),
    "opaque": OpSpec(required={"source_op": identifier}, max_inputs=None),
    "lstm": OpSpec(
        required={"hidden_size": positive_int},
        optional={"num_layers": positive_int, "bidirectional": boolean, "bias": boolean},
    ),
    "gru": OpSpec(
        required={"hidden_size": positive_int},
        optional={"num_layers": positive_int, "bidirectional": boolean, "bias": boolean},
    ),
    "rnn": OpSpec(
        required={"hidden_size": positive_int},
        optional={
            "num_layers": positive_int,
            "bidirectional": boolean,
            "bias": boolean,
            "nonlinearity": one_of("tanh", "relu"),
        },
    ),
    "softmax": OpSpec(optional={"dim": any_int}),
    "cross_entropy": OpSpec(optional={"ignore_index": any_int}, min_inputs=1, max_inputs=2),
    "block": OpSpec(nested=True),
    "repeat": OpSpec(required={"times": positive_int}, nested=True),
}

RESERVED_KEYS = frozenset({"name", "op", "inputs", "layers"})
BLOCK_INPUT = "@input"  # inside a block or repeat: the value that entered it


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphStats:
    """What a structural check learned about a graph."""

    layer_count: int
    op_counts: Mapping[str, int]


def validate_graph(layers: Sequence[Any], input_names: Iterable[str]) -> GraphStats:
    """Check a layer list: names unique, ops known, attributes valid, inputs defined earlier.

    Raises
    ------
    GraphError
        Naming the first offending layer and field.
    """
    if not isinstance(layers, Sequence) or isinstance(layers, str) or not layers:
        raise GraphError("must be a non-empty list of layers", field="layers")
    defined: set[str] = set(input_names)
    counts: dict[str, int] = {}
    total = _walk(layers, defined, set(defined), counts, depth=0, path="layers")
    return GraphStats(layer_count=total, op_counts=dict(sorted(counts.items())))


def _walk(
    layers: Sequence[Any],
    defined: set[str],
    local: set[str],
    counts: dict[str, int],
    *,
    depth: int,
    path: str,
) -> int:
    """Check ``layers``; ``defined`` is every visible name, ``local`` those of this scope."""
    if depth > MAX_DEPTH:
        raise GraphError(f"blocks nest deeper than {MAX_DEPTH} levels", field=path)
    total = 0
    previous: str | None = None
    for index, raw in enumerate(layers):
        where = f"{path}[{index}]"
        if not isinstance(raw, Mapping):
            raise GraphError("must be an object with 'name' and 'op'", field=where)
        name = raw.get("name")
        if not isinstance(name, str) or not name or len(name) > 128:
            raise GraphError("'name' must be a non-empty string (max 128 chars)", field=where)
        if name in local:
            raise GraphError("duplicate layer name", layer=name, field="name")
        op = raw.get("op")
        spec = OP_SPECS.get(op) if isinstance(op, str) else None
        if name == BLOCK_INPUT or name.startswith("@"):
            raise GraphError("names starting with '@' are reserved", layer=name, field="name")
        if spec is None or not isinstance(op, str):
            raise GraphError(
                f"unknown op {op!r}; known ops: {', '.join(sorted(OP_SPECS))}",
                layer=name,
                field="op",
            )
        _check_inputs(raw, spec, name, defined, previous)
        _check_attributes(raw, spec, name)
        counts[op] = counts.get(op, 0) + 1
        total += 1
        if spec.nested:
            body = raw.get("layers")
            if not isinstance(body, list) or not body:
                raise GraphError("must be a non-empty list of layers", layer=name, field="layers")
            # Names inside a block are scoped to it; they may shadow names defined before it.
            inner = set(defined) | {BLOCK_INPUT}
            body_count = _walk(body, inner, set(), counts, depth=depth + 1, path=f"{name}.layers")
            times = raw.get("times", 1)
            total += body_count * times
        elif "layers" in raw:
            raise GraphError(f"op '{op}' takes no nested layers", layer=name, field="layers")
        if total > MAX_LAYERS:
            raise GraphError(f"graph expands to more than {MAX_LAYERS} layers", field=path)
        defined.add(name)
        local.add(name)
        previous = name
    return total


def _check_inputs(
    raw: Mapping[str, Any], spec: OpSpec, name: str, defined: set[str], previous: str | None
) -> None:
    inputs = raw.get("inputs")
    if inputs is None:
        if spec.max_inputs == 0:
            return  # reads nothing (a stored tensor)
        if spec.min_inputs > 1:
            raise GraphError(f"needs at least {spec.min_inputs} inputs", layer=name, field="inputs")
        if previous is None and not defined:
            raise GraphError("no earlier layer or model input to read", layer=name, field="inputs")
        return
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise GraphError("must be a list of layer or input names", layer=name, field="inputs")
    if len(inputs) < spec.min_inputs:
        raise GraphError(f"needs at least {spec.min_inputs} inputs", layer=name, field="inputs")
    if spec.max_inputs is not None and len(inputs) > spec.max_inputs:
        raise GraphError(f"takes at most {spec.max_inputs} inputs", layer=name, field="inputs")
    for ref in inputs:
        if ref not in defined:
            raise GraphError(
                f"input {ref!r} is not a model input or an earlier layer",
                layer=name,
                field="inputs",
            )


def _check_attributes(raw: Mapping[str, Any], spec: OpSpec, name: str) -> None:
    for key in spec.required:
        if key not in raw:
            raise GraphError("is required", layer=name, field=key)
    for key, value in raw.items():
        if key in RESERVED_KEYS:
            continue
        check = spec.required.get(key) or spec.optional.get(key)
        if check is None and raw["op"] == "attention" and key == "fused":
            raise GraphError(
                "a graph says where attention is, not how it is computed: the attention "
                "implementation is a request option (attention=eager|sdpa_math|flash|"
                "mem_efficient); remove 'fused'",
                layer=name,
                field=key,
            )
        if check is None:
            allowed = sorted({*spec.required, *spec.optional})
            raise GraphError(
                f"unknown attribute for op '{raw['op']}'; allowed: {', '.join(allowed) or 'none'}",
                layer=name,
                field=key,
            )
        problem = check(value)
        if problem is not None:
            raise GraphError(problem, layer=name, field=key)
