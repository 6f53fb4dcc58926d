"""The import: bytes -> parsed, weights released, mapped, parameters counted twice (from the
initializers and from the graph) and compared, notes written.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

from onnx import ModelProto

from app.importers.onnx_model.attention import FUSED_DOMAIN
from app.importers.onnx_model.mapper import _Mapper
from app.importers.onnx_model.norms import _possibly_folded_batch_norm
from app.importers.onnx_model.parsing import parse_model
from app.importers.onnx_model.proto import _FLOAT_TYPES, _default_opset, _reject
from app.importers.onnx_model.weights import Weightless, strip_weights
from app.importers.result import (
    ImportedGraph,
    ImportRejected,
    OpMapping,
    UnsupportedOp,
    graph_parameter_count,
)

DEFAULT_SEQUENCE_LENGTH = 128


def _initializer_parameters(mapper: _Mapper) -> tuple[int, list[str], int]:
    """Parameters by the initializers alone: float tensors of more than one element that some
    supported node reads, less batch-norm running statistics. Also returns the names of those
    that feed no recognized weight slot (counted as parameters by assumption) and the
    elements read only by unsupported nodes (left out)."""
    buffers: set[str] = set()
    weight_slots: set[str] = set(mapper.folded_biases)
    vector_reads: Counter[str] = Counter(mapper.bias_reads)
    slots = {"Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1,), "LayerNormalization": (1, 2),
             "RMSNormalization": (1,), "BatchNormalization": (1, 2), "Gather": (0,),
             "LSTM": (1, 2, 3), "GRU": (1, 2, 3), "RNN": (1, 2, 3)}  # fmt: skip
    for node in mapper.nodes:
        if node.op_type == "BatchNormalization":
            buffers.update(node.input[3:5])
        if id(node) in mapper.synthesized and node.domain == FUSED_DOMAIN:
            positions: Sequence[int] = range(1, len(node.input))
        else:
            positions = slots.get(node.op_type, ())
        for position in positions:
            if len(node.input) > position and node.input[position]:
                const = mapper.consts.get(node.input[position])
                origin = const.origin if const and const.origin else node.input[position]
                weight_slots.add(origin)
                if const is not None and const.dims is not None and len(const.dims) == 1:
                    vector_reads[origin] += 1
    total, assumed, unsupported_only = 0, [], 0
    shared = 0
    for name, tensor in mapper.initializers.items():
        numel = math.prod(tensor.dims)
        if tensor.data_type not in _FLOAT_TYPES or numel <= 1 or name in buffers:
            continue
        if name in mapper.tied_copies or name in mapper.not_parameters:
            continue  # the same parameters as the tensor it copies; a fold's own bias
        if name not in mapper.supported_inputs:
            if name in mapper.unsupported_inputs:
                unsupported_only += numel
            continue
        # Exporters store equal tensors once (the dynamo exporter's optimizer merges the ones
        # and zeros of freshly initialised norms and biases): a vector that several layers
        # read as their bias or scale is a parameter of each.
        reads = max(1, vector_reads[name]) if len(tensor.dims) == 1 else 1
        total += numel * reads
        shared += reads > 1
        if name not in weight_slots:
            assumed.append(name)
    mapper.shared_vectors = shared
    return total + mapper.restored_params, assumed, unsupported_only


def load_onnx(read: Callable[[], bytes]) -> tuple[ModelProto, Weightless]:
    """Parse the bytes ``read()`` returns and release their weights.

    Only this call holds the bytes, so they are freed as soon as they are parsed; protobuf frees
    a cleared field's memory only with its whole message, so the stripped model is replaced by
    a copy of itself (a few MB). An import's peak is thus the file about twice, while parsing
    (``benchmarks/import_memory.py``), not for the whole import.
    """
    model = parse_model(read())
    weightless = strip_weights(model)
    compact = ModelProto()
    compact.ParseFromString(model.SerializeToString())
    return compact, weightless


def import_onnx(
    data: bytes, *, lenient: bool = False, sequence_length: int | None = None
) -> ImportedGraph:
    """Map an ONNX model onto the layer graph (see :func:`import_onnx_read`)."""
    return import_onnx_read(lambda: data, lenient=lenient, sequence_length=sequence_length)


def import_onnx_read(
    read: Callable[[], bytes], *, lenient: bool = False, sequence_length: int | None = None
) -> ImportedGraph:
    """Map the ONNX model ``read()`` returns onto the layer graph; the bytes are dropped once
    parsed when the caller holds no other reference (an upload read from its spooled file).

    Raises
    ------
    ImportRejected
        Garbage or truncated bytes, absurd sizes, a cyclic graph, failed shape inference,
        unsupported ops (unless ``lenient``), or a parameter count that does not add up.
    """
    model, weightless = load_onnx(read)
    seq = sequence_length or DEFAULT_SEQUENCE_LENGTH
    mapper = _Mapper(model, lenient=lenient)
    mapper.copies = weightless.copies
    try:
        mapper.run()
    except ImportRejected:
        raise
    except Exception as exc:  # a well-formed graph the mapper does not expect: a 422, never 500
        node = len(mapper.mapping) and sum(sum(c.values()) for c in mapper.mapping.values())
        raise _reject(
            f"the importer could not map this graph (stopped near node {node}: "
            f"{type(exc).__name__}); please report it with the file",
            kind="unmappable-onnx",
        ) from exc
    unsupported = tuple(
        UnsupportedOp(source_op=op, count=len(nodes), nodes=tuple(nodes[:5]))
        for op, nodes in sorted(mapper.unsupported.items())
    )
    if unsupported and not lenient:
        listing = ", ".join(f"{u.source_op} (x{u.count})" for u in unsupported)
        raise ImportRejected(
            f"the model uses ops that cannot be imported: {listing}; send lenient=true to "
            "import them as shape-preserving layers without parameters",
            pointer="/file",
            problems=mapper.unsupported_problems[:50],
            kind="unsupported-onnx-ops",
        )
    if not mapper.layers:
        raise _reject("no node of the graph computes on its inputs; nothing to import")
    bindings = {"seq": seq} if any("seq" in decl.shape for decl in mapper.inputs) else {}
    graph_params = graph_parameter_count(mapper.inputs, mapper.layers, bindings)
    source_params, assumed, left_out = _initializer_parameters(mapper)
    if graph_params != source_params:
        raise ImportRejected(
            f"parameter count mismatch: the initializers hold {source_params:,} parameters "
            f"but the imported graph has {graph_params:,}; the mapping lost or duplicated "
            "weights, so the model was not stored",
            pointer="/file",
            kind="parameter-mismatch",
        )
    notes = list(mapper.notes)
    if assumed:
        shown = ", ".join(assumed[:5]) + (" ..." if len(assumed) > 5 else "")
        notes.append(
            f"{len(assumed)} float initializer(s) outside a weight slot counted as parameters "
            f"(ONNX does not tell parameters from buffers): {shown}"
        )
    if left_out:
        notes.append(f"{left_out:,} initializer elements read only by unsupported ops are left out")
    if mapper.shared_vectors:
        notes.append(
            f"{mapper.shared_vectors} vector(s) (biases, norm scales) are read by several layers "
            "and counted once per layer: exporters store equal tensors once (freshly initialised "
            "biases and norm scales are all zeros or ones)"
        )
    if unsupported:
        notes.append("unsupported ops imported as shape-preserving layers with no parameters, "
                     "FLOPs or saved tensors: estimates are a lower bound there")  # fmt: skip
    if bindings:
        notes.append(f"default sequence length {seq}")
    notes.append("batch-norm running statistics are buffers, not parameters")
    for pattern, count in mapper.fused.items():
        notes.append(f"fused {count} exporter subgraph(s): {pattern}")
    if mapper.restored_batch_norms:
        notes.append(
            f"{mapper.restored_batch_norms} batch norm(s) restored after their convolutions: the "
            "dynamo exporter's optimizer folded them in (in train mode too) and its provenance "
            f"names them; their {mapper.restored_params:,} parameters are counted"
        )
    folded = 0 if mapper.restored_batch_norms else _possibly_folded_batch_norm(model)
    if folded:
        for layer in mapper.layers:
            if layer["op"] == "conv2d" and layer.get("bias"):
                layer["batchnorm_folded"] = True
        notes.append(
            f"{folded} convolution(s) carry a bias and the graph has no BatchNormalization: if "
            "the model has batch norm, an eval-mode torch.onnx.export folded it into the "
            "convolutions, and training estimates miss its saved tensors (the convolutions are "
            "marked batchnorm_folded and training estimates say so); for training, export "
            "with training=torch.onnx.TrainingMode.TRAINING (inference estimates are unaffected)"
        )
    if weightless.external or weightless.empty:
        notes.append(
            f"shapes without weights: {weightless.external} initializer(s) refer to external "
            f"data (never read) and {weightless.empty} carry no data; their dims give the "
            "parameters"
        )
    producer = model.producer_name or "unknown producer"
    graph_name = model.graph.name or "onnx model"
    mapping = tuple(
        OpMapping(source_op=op, count=count, mapped_to=ops)
        for op, counter in sorted(mapper.mapping.items())
        for ops, count in sorted(counter.items())
    )
    return ImportedGraph(
        name=graph_name[:200],
        family="onnx",
        description=(
            f"Imported from ONNX (producer {producer} {model.producer_version}, IR "
            f"{model.ir_version}, opset {_default_opset(model)}): {len(model.graph.node)} nodes, "
            f"{len(mapper.layers)} layers."
        )[:4000],
        inputs=tuple(mapper.inputs),
        layers=mapper.layers,
        default_bindings=bindings,
        parameter_count=graph_params,
        source_parameter_count=source_params,
        reference="ONNX initializers",
        op_mapping=mapping,
        unsupported=unsupported,
        assumptions=tuple(notes),
    )
