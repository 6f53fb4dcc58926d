"""Pins: a regression snapshot of the memory model over ~3,600 configurations.

These tests pin today's figures; they do not say the figures are right (the golden tests in
``test_memory.py`` and the CPU fidelity benchmark do). What they prove is that a change moved
nothing but what it names.

Every zoo model and six imported graphs (Hugging Face configs with MoE, GPT-NeoX, T5 and
Gemma; ONNX files with matmul attention and a CNN) in both modes, across precisions, runtimes,
optimizers and their implementations, checkpointing policies, parallelism and accumulation. The
snapshot (``memory_snapshot.json``) keeps the peak per configuration and a digest of the whole
estimate (every line, formula, assumption and, for the first variant, the per-layer view), so
a refactor of the timeline that changes any figure or text fails here, naming the
configuration.

The ~3,500 original configurations are pinned to ``attention=eager`` and ``logits=all``, the
behaviour before the attention implementation became a request option, so that they show that
nothing else moved when it did (issue 12: only encoder-inference peaks moved, by their KV-cache
line, and formula texts changed to evaluable arithmetic; a run of the engine before and after
with formulas left out of the digest gave identical digests). The ``|defaults|`` entries pin the
defaults a request gets: PyTorch SDPA's attention for the runtime and precision, the default
precision of the mode and runtime, and the last position's logits at inference.

Issue 13 replaced the CUDA allocator lines (512 B / 2 MiB rounding and a 5 % fragmentation
reserve) with a replay of PyTorch's caching allocator: every ``pytorch_cuda`` entry moved
(peaks by -16 % to +15 %, median -0.5 %), no ``pytorch_cpu`` entry did, digest included. It
then added the second cuBLAS workspace of training (autograd's thread), the padded fp32
log-sum-exp of CUDA's memory-efficient attention, DDP's gradient buckets and FSDP's gather
buffers: of the CPU entries only the 72 ZeRO-3 ones moved (FSDP buffers, any runtime).

Issue 14 fused the attention that exporters write out into the graph's ``attention`` op: the
200 ``onnx:attention`` entries moved (their graph now holds one attention layer instead of
projections, reshapes, two matmuls and a softmax; its feed-forward reads a residual sum, not a
norm, so it stays linear, gelu, linear), no other entry did. Adding GRU and RNN's native CPU cell
changed the CPU runtime's assumption text: every ``pytorch_cpu`` digest changed, no peak moved
(no pinned graph has a GRU or an RNN).

Issue 32 named GPT-NeoX's attention layer ``attention``, as ``modeling_gpt_neox.py`` (and so
PEFT's ``layers.<i>.attention.query_key_value``) does, in place of ``attn``: the 24 first-variant
``hf:pythia-160m`` digests changed (the per-layer view's names), no peak moved.

Issue 32, CPU rules re-derived before the inputs were counted once: a oneDNN convolution's
forward buffer became the larger of its input and output (a transposed one's two outputs, was
one output). 38 ``pytorch_cpu`` inference peaks moved, all up: the 19 ``mobilenet-v2`` ones by
2 / 3 of the image's bytes (+401,408 B at fp32: the peak moves from ``stage2.0.expand`` to the
stride-2 depthwise conv after it, whose output, 1,204,224 B, replaces the expand's input,
802,816 B, beside the same two 4,816,896 B tensors), the 19 ``3d-unet-kits19`` ones by 32 x the
input's bytes (+256 MiB at fp32: the peak moves from ``upsample.4.cat`` to ``upsample.4.conv1``,
whose buffer is its 512 MiB input, where the transposed conv's and the ReLU's outputs were);
the runtime's assumption text changed (every other ``pytorch_cpu`` digest); no CUDA entry moved.

Issue 32 then counted each model input once: the forward's replay started from the inputs'
bytes, so every moment's activations held them beside the ``inputs`` line. 2,894 of the 3,800
peaks moved, each down by exactly its inputs' bytes (CPU 1,487, CUDA 1,407; -512 B to
-8,388,608 B, median -8,192 B; -0.00 % to -7.8 %, the CUDA ones' allocator lines unchanged: the
replay allocated the inputs once already); the other 906 peak in the optimizer step, which
never held activations: peak unchanged, digest changed (the forward and backward phase peaks
fall by the input bytes); no error entry changed.

Issue 32 charged Hugging Face's loss as PyTorch runs it (app/domain/memory/loss.py: the
``logits.float()`` copy, the two fp32 loss gradients, the logits dropped before backward): 2,029
training peaks moved (median -0.004 %, -19.6 % to +16.5 %; no inference entry), 1,049 more
training digests changed. Then the reserve's explanation gained the reason it has no upper
bound: the 1,900 ``pytorch_cuda`` digests changed, no peak moved; and the loss's assumption
(the logits freed before backward) was stated: the 3,078 training digests with a cross-entropy
changed, no peak moved.

The snapshot was generated before the timeline became array-based (running sums instead of a
per-layer replay of live sets): the zoo entries by that older engine, the imported ones by the
older engine extended with the importers' ops. An intended change to the model regenerates it:
``UPDATE_MEMORY_SNAPSHOT=1 .venv/bin/python -m pytest tests/domain/test_memory_snapshot.py``
(and the diff of the JSON shows which peaks moved).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import itertools
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.domain import workload as W
from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.memory import estimate as M
from app.domain.precision import Precision
from app.domain.zoo import ZOO
from app.importers.hf_config import import_hf_config
from app.importers.onnx_model import import_onnx
from tests.domain.test_formulas import evaluate
from tests.importers.onnx_models import small_cnn, tiny_attention

SNAPSHOT = Path(__file__).with_name("memory_snapshot.json")
HF_CONFIGS = Path(__file__).parents[1] / "fixtures" / "hf_configs"
LARGE = ("gpt-3-175b", "llama-2-7b", "llama-3-8b")


# MemoryEstimate.cuda (issue 13): None on the CPU runtime; host_lines (issue 32): None without
# host memory (no offload, no paged optimizer)
_ADDED_LATER = frozenset({"cuda", "host_lines"})


def _canon(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Fields added later are left out while unset (None), so older digests stay valid.
        return {
            f.name: _canon(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None or f.name not in _ADDED_LATER
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    return value


def _variants(mode: W.Mode) -> list[dict[str, Any]]:
    if mode is W.Mode.INFERENCE:
        return [{}, {"kv_cache": False}, {"parallelism": W.Parallelism(tensor=2)}]
    variants: list[dict[str, Any]] = [
        {"optimizer": opt, "optimizer_impl": impl, "checkpointing": ckpt}
        for opt, impl, ckpt in itertools.product(
            [W.Optimizer.ADAMW, W.Optimizer.SGD_MOMENTUM, W.Optimizer.ADAFACTOR],
            [W.OptimizerImpl.AUTO, W.OptimizerImpl.FOR_LOOP],
            list(W.Checkpointing),
        )
    ]
    variants.append(
        {"parallelism": W.Parallelism(data=4, tensor=2, zero_stage=2), "accumulation_steps": 4}
    )
    variants.append({"parallelism": W.Parallelism(data=8, zero_stage=3), "fp32_grad_buffer": True})
    return variants


def _imported() -> Iterator[tuple[str, tuple[InputDecl, ...], list[Any], dict[str, int]]]:
    """Graphs the importers build: matmuls keeping a second input, MoE, stored tensors."""
    for name in ("mixtral-8x7b-v0.1", "pythia-160m", "t5-small-encoder", "gemma-2b"):
        config = json.loads((HF_CONFIGS / f"{name}.json").read_text())
        graph = import_hf_config(config, sequence_length=64)
        yield f"hf:{name}", graph.inputs, graph.layers, {**graph.default_bindings, "batch": 1}
    for name, data in (("cnn", small_cnn()), ("attention", tiny_attention(tied=False))):
        graph = import_onnx(data)
        yield f"onnx:{name}", graph.inputs, graph.layers, {**graph.default_bindings, "batch": 2}


def _models() -> Iterator[tuple[str, tuple[InputDecl, ...], Any, dict[str, int]]]:
    for slug, model in ZOO.items():
        bindings = {**model.default_bindings, "batch": 1}
        if slug in LARGE:
            bindings["seq"] = 512
        yield slug, model.inputs, model.layers, bindings
    yield from _imported()


def _cases() -> Iterator[tuple[str, GraphAnalysis, M.MemoryRequest, bool]]:
    for slug, inputs, layers, bindings in _models():
        for mode in W.Mode:
            # Pinned to eager attention and every position's logits: the behaviour the
            # snapshot was taken with; analysed per runtime, as a request is (cuDNN's work
            # spaces are CUDA's).
            analyses = {
                runtime: analyze(
                    inputs,
                    layers,
                    bindings,
                    training=mode is W.Mode.TRAINING,
                    attention=W.Attention.EAGER,
                    logits=W.Logits.ALL,
                    runtime=runtime,
                )
                for runtime in W.Runtime
            }
            precisions = [
                Precision.FP32,
                Precision.BF16,
                Precision.AMP_FP16,
                Precision.MIXED_BF16,
            ]
            if mode is W.Mode.INFERENCE:
                precisions += [Precision.INT4, Precision.FP8]
            for precision, runtime in itertools.product(precisions, W.Runtime):
                for index, variant in enumerate(_variants(mode)):
                    request = M.MemoryRequest(
                        mode=mode, precision=precision, runtime=runtime, **variant
                    )
                    label = f"{slug}|{mode.value}|{precision.value}|{runtime.value}|{index}"
                    yield label, analyses[runtime], request, index == 0
    yield from _default_cases()


def _default_cases() -> Iterator[tuple[str, GraphAnalysis, M.MemoryRequest, bool]]:
    """Every model in both modes on both runtimes with the defaults a request gets."""
    for slug, inputs, layers, bindings in _models():
        for mode, runtime in itertools.product(W.Mode, W.Runtime):
            request = M.MemoryRequest(
                mode=mode,
                precision=W.default_precision(mode, runtime),
                runtime=runtime,
                logits=W.Logits.LAST if mode is W.Mode.INFERENCE else W.Logits.ALL,
            )
            analysis = M.analyze_for(inputs, layers, bindings, request)
            yield f"{slug}|{mode.value}|defaults|{runtime.value}|0", analysis, request, True


def _estimate(
    analysis: GraphAnalysis, request: M.MemoryRequest, per_layer: bool
) -> M.MemoryEstimate | str:
    try:
        return M.estimate_memory(analysis, request, per_layer=per_layer)
    except M.MemoryInputError as exc:
        return str(exc)


def _entry(estimate: M.MemoryEstimate | str) -> list[Any]:
    if isinstance(estimate, str):
        return ["error", estimate]
    text = json.dumps(_canon(estimate), sort_keys=True, separators=(",", ":"))
    return [estimate.peak_bytes, hashlib.sha256(text.encode()).hexdigest()[:16]]


@pytest.fixture(scope="module")
def estimates() -> dict[str, M.MemoryEstimate | str]:
    return {label: _estimate(a, r, per_layer) for label, a, r, per_layer in _cases()}


@pytest.fixture(scope="module")
def current(estimates: dict[str, M.MemoryEstimate | str]) -> dict[str, list[Any]]:
    entries = {label: _entry(estimate) for label, estimate in estimates.items()}
    if os.environ.get("UPDATE_MEMORY_SNAPSHOT"):
        lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(entries.items())]
        SNAPSHOT.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    return entries


def test_memory_estimates_match_snapshot(current: dict[str, list[Any]]) -> None:
    """Pin: every configuration's peak and digest are the snapshot's."""
    expected: dict[str, list[Any]] = json.loads(SNAPSHOT.read_text())
    assert sorted(current) == sorted(expected)
    changed = [
        f"{label}: peak {expected[label][0]} -> {current[label][0]}"
        for label in sorted(expected)
        if current[label] != expected[label]
    ]
    assert not changed, f"{len(changed)} estimates changed:\n" + "\n".join(changed[:20])


def test_snapshot_is_not_trivial() -> None:
    """The snapshot covers both modes, the defaults and many distinct peaks."""
    expected: dict[str, list[Any]] = json.loads(SNAPSHOT.read_text())
    peaks = {entry[0] for entry in expected.values() if entry[0] != "error"}
    assert len(expected) > 2000
    assert len(peaks) > 1000
    assert {label.split("|")[1] for label in expected} == {"training", "inference"}
    defaults = [label for label in expected if label.split("|")[2] == "defaults"]
    assert len(defaults) == 4 * sum(1 for _ in _models())


def test_every_formula_of_the_snapshot_evaluates(
    estimates: dict[str, M.MemoryEstimate | str],
) -> None:
    """Every line of every configuration: its formula's arithmetic is its bytes."""
    wrong = [
        f"{label} {line.key}: {line.bytes:,} vs {line.formula}"
        for label, estimate in estimates.items()
        if not isinstance(estimate, str)
        for line in estimate.lines
        if evaluate(line.formula) != (line.bytes, line.bytes)
    ]
    assert len(estimates) > 3500
    assert not wrong, f"{len(wrong)} formulas disagree with their lines:\n" + "\n".join(wrong[:10])
