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
from app.domain.memory.context import Estimation
from app.domain.memory.liveness import Peak
from app.domain.workload import TrainingOptionError

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


def chunk_sizes(e: Estimation, loss: int, chunks: int, logits_bytes: int) -> tuple[int, int]:
    """torchtune's CEWithChunkedOutputLoss (torchtune 0.6 torchtune/modules/loss/
    ce_chunked_output_loss.py: ``compute_cross_entropy`` = ``F.cross_entropy(logits.float(),
    labels, reduction="sum")`` per chunk of the output head's chunked logits): (one chunk's
    fp32 size, its ``logits.float()`` copy: 0 when the logits are fp32, since
    ``Tensor.float()`` returns the tensor itself) [B]: ``ceil(rows / chunks) x vocab x 4``.

    Raises
    ------
    TrainingOptionError
        The output is not token-level logits with a loss outside the graph (``loss_chunks``).
    """
    shape = e.analysis.output_shape
    if len(shape) < 3 or not loss:
        raise TrainingOptionError(
            "loss_chunks chunks a token-level loss: the model's output is not [batch, seq, "
            "vocab] logits with a loss outside the graph",
            field="loss_chunks",
        )
    rows, vocab = math.prod(shape[:-1]), shape[-1]
    chunk = -(-rows // chunks) * vocab * 4
    words = f"ceil({rows:,} [tokens] / {chunks} [loss_chunks]) x {vocab:,} [vocab] x 4 [B fp32]"
    upcast = 0 if logits_bytes == math.prod(shape) * 4 else chunk
    if upcast:
        e.loss_transient["end"] = (upcast, f"{words} [one chunk's logits.float() upcast]")
    e.loss_transient["loss"] = (
        2 * chunk,
        f"2 x {words} [one chunk's fp32 gradients: nll_loss's of its log-probs, log_softmax's "
        "of its input]",
    )
    e.assumptions.append(
        f"loss_chunks={chunks}: torchtune's CEWithChunkedOutputLoss: the output head's chunks "
        "(the whole logits) live until the loss returns, with every chunk's fp32 "
        "log-probabilities (log_softmax keeps them) and one chunk's fp32 upcast; the loop then "
        "drops the logits (torchtune's del logits). In backward every chunk's loss runs "
        "before the output head's (autograd runs the later-created node first): each holds "
        "two fp32 chunk gradients and frees its log-probabilities, so the head's backward "
        "holds the logits' whole gradient and no log-probabilities"
    )
    return chunk, upcast


def chunked_loss(
    e: Estimation, end_bytes: int, dropped: int, chunk: int, upcast: int
) -> tuple[Peak, list[Peak]]:
    """The forward's end and the loss's backward with ``loss_chunks``
    (:func:`chunk_sizes`; measured on an H200, benchmarks/fidelity/cuda/
    cuda_measurements_peft.json: GPT-2 fp32 AdamW batch 4 x 512 with 8 chunks, allocated
    4,370 MiB, at the forward's end; the rule before held the logits and every chunk's
    log-probabilities through backward: 4,813). The end: the activations with the output and
    the upcast of one chunk; the loss's backward (its first chunk, the largest moment): the
    activations without the dropped output, two fp32 chunk gradients."""
    activations = end_bytes - dropped
    if "loss" in e.offload_terms:  # offloaded: the last layers' copies have left
        activations = e.offload_terms["loss"][0][0]
    return Peak(activations=end_bytes, transient=upcast, at="end"), [
        Peak(activations=activations, transient=2 * chunk, at="loss")
    ]
