"""ONNX model bytes -> layer graph.

Only the bytes given are read: the model is parsed with ``ModelProto.ParseFromString`` and
shape-inferred in memory. The planner needs shapes, not weights: an initializer may refer to
external data (the path is never opened) or carry no data at all (a graph-only export), and
the data of float weights that did come is released right after parsing (``strip_weights``),
so the shape inference and its probes copy a graph of a few MB, whatever the model's size.
Nodes are mapped in their (topological) order onto graph ops:

* weights of Conv, Gemm, MatMul (constant right operand, with a following bias Add folded in),
  BatchNormalization, LayerNormalization, RMSNormalization and Gather-as-embedding stay with
  their op; a MatMul whose weight an earlier embedding owns is tied to it;
* other float initializers that feed activations (a position embedding, a class token) become
  ``tensor`` layers, counted as parameters;
* nodes that only compute on constants and shapes (Shape, Gather on a shape, Concat of ints,
  Constant, ...) are folded away: their values only size later reshapes, which take their
  output shape from ONNX shape inference;
* everything else is unsupported: listed, and rejected unless ``lenient`` (then a zero-param,
  shape-preserving ``opaque`` layer).

Parameters are counted twice, independently: from the initializers (float tensors of more
than one element, minus batch-norm running statistics) and from the graph's shape inference.
The two must be equal.

The modules, from the bytes to the graph: ``parsing`` (hostile-input checks), ``weights``
(released data, copies of a parameter), ``mapper`` (the walk; its op handlers in
``compute_ops`` and ``tensor_ops`` over ``mapper_base``), the exporter patterns it fuses
(``gelu``, ``norms``, ``attention``, ``mlp``, over ``rewrite``), ``proto`` (reading ONNX
protos) and ``importer`` (the import itself). Names with a leading underscore are private to
this package.
"""

from app.importers.onnx_model.importer import import_onnx, import_onnx_read

__all__ = ["import_onnx", "import_onnx_read"]
