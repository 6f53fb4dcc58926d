"""The loss as PyTorch runs it: the tensors a cross-entropy creates besides the
log-probabilities it keeps for backward (:func:`app.domain.memory.formulas.loss_bytes`).

Hugging Face's default causal-LM loss (transformers ``loss/loss_utils.py``,
``ForCausalLMLoss``, transformers 4.46 to 5.x): ``logits = logits.float()`` ("upcast to float
... to avoid potential precision issues"), the labels padded and shifted (not the logits), then
``F.cross_entropy`` = ``log_softmax`` + ``nll_loss`` (PyTorch ``torch/nn/functional.py``,
``aten/src/ATen/native/LossNLL.cpp``). As the autograd graph holds them:

* forward: ``.float()`` allocates an fp32 copy of the logits unless they are fp32 already
  (``Tensor.float()`` returns the tensor itself then); ``log_softmax`` allocates its fp32
  output and keeps it (``LogSoftmaxBackward`` saves ``result``); nothing keeps the copy
  (``ToCopyBackward`` saves no tensor), so it dies when ``ForCausalLMLoss`` returns: a
  transient of the forward's end;
* backward: ``NllLossBackward`` allocates the gradient of the log-probabilities (zero-filled,
  their size and dtype), ``LogSoftmaxBackward`` the gradient of its input (the same size),
  then releases its saved log-probabilities (``release_variables`` after the node runs,
  ``retain_graph=False``); with an upcast ``ToCopyBackward`` casts that fp32 gradient to the
  logits' dtype (the output gradient the model's backward reads) and the fp32 one dies.

``logits_sum``: the loop sums the logits instead (``outputs.logits.sum().backward()``, as
Hugging Face's SDPA training benchmark does): no log-probabilities, no upcast, no loss
gradients (``SumBackward`` expands the scalar gradient), the output gradient only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.domain.graph.analysis import GraphAnalysis

SOURCE = (
    "transformers loss/loss_utils.py ForCausalLMLoss (logits.float(), F.cross_entropy); "
    "PyTorch log_softmax / nll_loss autograd (LogSoftmaxBackward saves its result)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LossTensors:
    """A training step's loss tensors besides the kept log-probabilities [B]."""

    upcast_bytes: int  # logits.float(): the fp32 copy, a transient at the forward's end
    grad_bytes: int  # each of nll_loss's and log_softmax's gradients (the log-probs' size)
    upcast_words: str  # the arithmetic of upcast_bytes
    grad_words: str  # the arithmetic of grad_bytes


NO_LOSS = LossTensors(upcast_bytes=0, grad_bytes=0, upcast_words="", grad_words="")


def loss_tensors(analysis: GraphAnalysis, logits_bytes: int, log_probs_bytes: int) -> LossTensors:
    """The upcast copy and the loss's gradients of a cross-entropy over the model's output.

    ``logits_bytes``: the output tensor [B] (the model's last activation); ``log_probs_bytes``:
    what ``log_softmax`` keeps (:func:`~app.domain.memory.formulas.loss_bytes`; 0: no loss
    outside the graph, or the logits summed). Token-level logits (rank 3) are upcast to fp32
    first (``ForCausalLMLoss``) unless already fp32; a classifier's ``F.cross_entropy`` reads
    its logits as they are."""
    if not log_probs_bytes:
        return NO_LOSS
    shape = analysis.output_shape
    numel = math.prod(shape) if shape else 1
    upcast = 0
    upcast_words = ""
    if len(shape) >= 3 and logits_bytes != numel * 4:
        upcast = numel * 4
        upcast_words = (
            f"{numel:,} [logits elements] x 4 [B: logits.float(), HF ForCausalLMLoss's fp32 copy; "
            f"the logits are {logits_bytes:,} B]"
        )
    grad_words = (
        f"{log_probs_bytes:,} [B: the log-probabilities' size: nll_loss's zero-filled gradient, "
        "then log_softmax's gradient of its input]"
    )
    return LossTensors(
        upcast_bytes=upcast,
        grad_bytes=log_probs_bytes,
        upcast_words=upcast_words,
        grad_words=grad_words,
    )
