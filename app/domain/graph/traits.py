"""What the planners need to know about each op beyond its shapes: one home for op traits.

Shapes, parameters, FLOPs and saved tensors live in :mod:`app.domain.graph.ops`; these sets
say how an op behaves in a kernel schedule, under quantization and under tensor parallelism.
"""

from __future__ import annotations

# Element-wise layers an inference engine (TensorRT, OpenVINO, oneDNN, torch.compile) fuses
# into the epilogue of the kernel that produced their input.
FUSABLE_EPILOGUE_OPS = frozenset(
    {"batchnorm2d", "relu", "relu6", "gelu", "silu", "tanh", "sigmoid", "add"}
)
# Layers that run several kernels: one per weight matrix plus one for what lies between them
# (attention's softmax(QK^T)V, the MLP's activation, the recurrence).
MULTI_KERNEL_OPS = frozenset({"attention", "mlp", "lstm", "gru", "rnn"})
# Layers that read rows of a table instead of multiplying by it.
LOOKUP_OPS = frozenset({"embedding", "embedding_add"})
# Layers whose matrices a weight quantizer (GPTQ/AWQ, TensorRT, bitsandbytes) converts.
QUANTIZABLE_OPS = frozenset(
    {"conv2d", "depthwise_conv2d", "pointwise_conv2d", "conv3d", "conv_transpose3d", "linear",
     "attention", "mlp", "moe", "lstm", "gru", "rnn"}
)  # fmt: skip
# Layers whose new saved tensors are internal (S x S scores, MLP intermediates): tensor
# parallelism splits them, and their gradients are live inside the layer's backward.
INTERNAL_TENSOR_OPS = frozenset({"attention", "mlp", "moe"})
# Layers that run a cuBLAS GEMM on CUDA (their projections, not cuDNN): the first one of a
# process allocates the cuBLAS workspaces (aten/src/ATen/cuda/CublasHandlePool.cpp).
CUBLAS_GEMM_OPS = frozenset({"linear", "matmul", "attention", "mlp", "moe"})
# Convolutions (oneDNN holds an output-sized buffer in their CPU forward; PyTorch 2.13 CPU
# measured 2.03x the output for a stride-1 conv3d, more for strided (5.1x) and transposed
# (3.0x) 3-d ones, which this one buffer understates).
CONV_OPS = frozenset(
    {"conv2d", "depthwise_conv2d", "pointwise_conv2d", "conv3d", "conv_transpose3d"}
)
