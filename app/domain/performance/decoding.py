"""Decoder serving: length distributions, static vs continuous batching, beam search (pure).

A decoder LLM server is asked for requests whose prompt and output lengths vary. How it
batches them decides how many sequences run at once and what each step costs:

* **static** batching (Hugging Face ``generate``, FasterTransformer, today's default here):
  the batch is padded to the longest prompt and runs until its longest output, so every
  request is priced at the maximum lengths; each of the ``k`` beams is its own row
  (``generate`` repeats the prompt ``k`` times before the prefill, so the prompt's KV cache is
  held ``k`` times), and the memory fit reserves the full ``prompt + generated`` KV cache of
  every row.
* **continuous** (in-flight) batching with a paged KV cache (TensorRT-LLM, vLLM): a finished
  request leaves the batch at once and a waiting one takes its place, so in steady state the
  engine runs the *mean* request: a prefill of the mean prompt and ``g_mean - 1`` decode steps
  at the mean context. The cache is allocated in blocks of ``b`` tokens; a request holds the
  blocks of its whole context (prompt + generated, reserved at admission as TensorRT-LLM's
  default ``GUARANTEED_NO_EVICT`` scheduler does), rounded up to blocks. With ``k`` beams the
  prompt's *full* blocks are shared by the beams (one copy, reference-counted) and the prompt's
  last partial block and every generated token's blocks are per beam: TensorRT-LLM's
  ``KVCacheManager::getNeededBlocksOneStep`` ("shared among beam") and ``addSequence``
  (``shareAmongBeams``), vLLM's copy-on-write blocks (Kwon et al. 2023, section 4.4). The
  prefill runs once per request; decode steps run ``k`` sequences per request, each attending
  to its whole context, but read the shared prompt from memory once per request
  (:attr:`DecoderServing.shared_read_prompt_tokens`). A runtime that copies the prompt's cache
  to every beam (Neural Speed) is ``prompt_shared_by_beams=False``: each beam holds and reads
  its own copy.

Concurrency under continuous batching is bounded by the KV blocks that fit beside the weights
and runtime: ``N = floor(KV budget / KV bytes per request)``; throughput in steady state is
requests completed per second: ``N / (prefill of N mean prompts + (g_mean - 1) decode steps of
N k sequences at the mean context)``.

References
----------
Yu et al., "Orca: A Distributed Serving System for Transformer-Based Generative Models",
OSDI 2022 (iteration-level scheduling). Kwon et al., "Efficient Memory Management for Large
Language Model Serving with PagedAttention", SOSP 2023.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from app.domain.errors import DomainError
from app.domain.graph.analysis import GraphAnalysis
from app.domain.parallel import kv_heads_per_rank
from app.domain.performance.phases import PhasedRequestShape, decoder_shape

# TensorRT-LLM's paged-KV block: PluginConfig._tokens_per_block defaults to 64
# (tensorrt_llm/plugin/plugin.py, NVIDIA/TensorRT-LLM 0.x; vLLM's default block is 16 tokens).
# A request option.
DEFAULT_KV_BLOCK_TOKENS = 64
MAX_BEAM_WIDTH = 16


class DecodingInputError(DomainError):
    """Length distributions, batching or beams a decoder cannot be served with."""


class Batching(StrEnum):
    """How a decoder server groups requests."""

    STATIC = "static"  # padded to the maximum lengths, run until the longest output
    CONTINUOUS = "continuous"  # in-flight batching with a paged KV cache


@dataclass(frozen=True, slots=True, kw_only=True)
class DecoderServing:
    """The length distribution of a decoder's requests and how they are served."""

    prompt_tokens_max: int
    prompt_tokens_mean: int
    generated_tokens_max: int
    generated_tokens_mean: int
    batching: Batching = Batching.STATIC
    beam_width: int = 1
    kv_block_tokens: int = DEFAULT_KV_BLOCK_TOKENS
    # Continuous batching: the beams share the prompt's KV blocks (TensorRT-LLM, vLLM). False
    # for a runtime that copies the prompt's KV cache to every beam (Neural Speed's
    # beam_search_kv_cache_reorder: "cpy batch 1 to all batches" after the prompt).
    prompt_shared_by_beams: bool = True

    def __post_init__(self) -> None:
        for name in ("prompt_tokens_max", "prompt_tokens_mean", "generated_tokens_max",
                     "generated_tokens_mean", "kv_block_tokens"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DecodingInputError(f"{name} must be an integer >= 1, got {value!r}")
        if not 1 <= self.beam_width <= MAX_BEAM_WIDTH:
            raise DecodingInputError(
                f"beam_width must be in [1, {MAX_BEAM_WIDTH}], got {self.beam_width!r}"
            )
        if self.prompt_tokens_mean > self.prompt_tokens_max:
            raise DecodingInputError(
                f"prompt_tokens_mean {self.prompt_tokens_mean} exceeds the maximum "
                f"prompt_tokens {self.prompt_tokens_max}"
            )
        if self.generated_tokens_mean > self.generated_tokens_max:
            raise DecodingInputError(
                f"generated_tokens_mean {self.generated_tokens_mean} exceeds the maximum "
                f"generated_tokens {self.generated_tokens_max}"
            )

    @property
    def continuous(self) -> bool:
        """In-flight batching with a paged KV cache."""
        return self.batching is Batching.CONTINUOUS

    @property
    def priced_prompt_tokens(self) -> int:
        """The prompt a request is priced at: the mean (continuous) or the maximum (static)."""
        return self.prompt_tokens_mean if self.continuous else self.prompt_tokens_max

    @property
    def priced_generated_tokens(self) -> int:
        """Tokens generated per request as priced: the mean (continuous) or the maximum."""
        return self.generated_tokens_mean if self.continuous else self.generated_tokens_max

    @property
    def mean_context_tokens(self) -> int:
        """The context a decode step attends to, on average over the steps [tokens]:
        prompt + generated / 2 at the priced lengths."""
        return self.priced_prompt_tokens + self.priced_generated_tokens // 2

    @property
    def shared_read_prompt_tokens(self) -> int:
        """Prompt tokens a decode step reads from memory once per request, not once per beam
        [tokens]: the whole mean prompt under continuous batching with beams, else 0.

        The beams of a request attend to the same cached prompt. TensorRT-LLM's masked MHA
        kernel reads every beam's context keys and values from beam 0's blocks ("Handle only
        context key cache with beam searching", ``decoderMaskedMultiheadAttentionTemplate.h``),
        in thread blocks that run together, so the repeats are cache hits; Intel Extension for
        PyTorch's indirect-access KV cache dots each cached prompt row with all the beams'
        queries in one pass (``scale_dot_product_for_indirect_access_kv_cache``). Static
        batching (``generate`` repeating the prompt per beam) reads each beam's own copy.
        """
        if not self.continuous or self.beam_width == 1 or not self.prompt_shared_by_beams:
            return 0
        return self.prompt_tokens_mean

    @property
    def decode_steps(self) -> int:
        """Decode steps per request (the prefill gives the first token)."""
        return self.priced_generated_tokens - 1

    def kv_tokens_per_request(self) -> int:
        """Token slots of KV cache one request holds, all beams together [tokens].

        Static: ``k (P_max + g_max)`` (every beam a padded row). Continuous:
        :func:`paged_kv_tokens` of the mean request's whole context.
        """
        if not self.continuous:
            return self.beam_width * (self.prompt_tokens_max + self.generated_tokens_max)
        if not self.prompt_shared_by_beams:
            context = self.prompt_tokens_mean + self.generated_tokens_mean
            return (
                self.beam_width * self.kv_block_tokens * math.ceil(context / self.kv_block_tokens)
            )
        return paged_kv_tokens(
            self.prompt_tokens_mean,
            self.generated_tokens_mean,
            beam_width=self.beam_width,
            block_tokens=self.kv_block_tokens,
        )

    def describe(self) -> str:
        """The serving assumptions in one line."""
        beams = (
            ""
            if self.beam_width == 1
            else f"; beam search with {self.beam_width} beams: decode runs {self.beam_width} "
            "sequences per request"
        )
        if not self.continuous:
            return (
                f"static batching: every request padded to prompt_tokens {self.prompt_tokens_max} "
                f"and run for generated_tokens {self.generated_tokens_max} (the batch waits for "
                f"its longest output), KV cache reserved for the whole padded context of every "
                f"row{beams}"
                + (
                    " (each beam a row: the prompt's KV cache held once per beam, "
                    "as transformers' generate expands the input)"
                    if self.beam_width > 1
                    else ""
                )
            )
        return (
            f"continuous (in-flight) batching with a paged KV cache: in steady state the mean "
            f"request (prompt {self.prompt_tokens_mean}, {self.generated_tokens_mean} generated "
            f"tokens; maxima {self.prompt_tokens_max} and {self.generated_tokens_max}) is "
            f"prefilled once and decoded {self.decode_steps} steps at the mean context "
            f"{self.mean_context_tokens} tokens; KV cache in blocks of {self.kv_block_tokens} "
            f"tokens, the mean request's prompt + generated tokens reserved at admission "
            f"({self.kv_tokens_per_request()} token slots per request, all beams){beams}"
            + (
                " (every beam holds and reads its own copy of the prompt's KV cache)"
                if self.beam_width > 1 and not self.prompt_shared_by_beams
                else " (the prompt's full blocks shared by the beams, as TensorRT-LLM's KV cache "
                "manager and vLLM's copy-on-write blocks do; each decode step reads the "
                "cached prompt once per request, not once per beam, as TensorRT-LLM's and "
                "Intel Extension for PyTorch's beam-search attention kernels do)"
                if self.beam_width > 1
                else ""
            )
        )


def paged_kv_tokens(
    prompt_tokens: int, generated_tokens: int, *, beam_width: int, block_tokens: int
) -> int:
    """KV-cache token slots of one request in a paged cache, all beams together.

    Parameters
    ----------
    prompt_tokens : P [tokens]
    generated_tokens : g [tokens]
    beam_width : k [-]
    block_tokens : b, tokens per KV block [tokens]

    Returns
    -------
    slots : ``b * (floor(P / b) + k * ceil((P mod b + g) / b))`` [tokens]

    Notes
    -----
    The prompt's full blocks are shared by the beams; its last partial block and the blocks of
    the generated tokens are per beam (TensorRT-LLM ``KVCacheManager``; vLLM copy-on-write).
    With one beam this is ``b * ceil((P + g) / b)``: the context rounded up to whole blocks.
    """
    shared = prompt_tokens // block_tokens
    own = math.ceil((prompt_tokens % block_tokens + generated_tokens) / block_tokens)
    return block_tokens * (shared + beam_width * own)


def kv_bytes_per_request(serving: DecoderServing, kv_bytes_per_token: int, *, gpus: int = 1) -> int:
    """KV cache one request holds, all beams, per GPU of a group whose GPUs split the cache
    evenly (the layers of pipeline stages, the average stage) [B]. Under tensor parallelism pass
    one rank's ``kv_bytes_per_token`` (:func:`kv_elements_per_token` with ``tensor``): KV heads
    are replicated, not split, past the heads.

    Parameters
    ----------
    serving : lengths, batching and beams (:meth:`DecoderServing.kv_tokens_per_request`)
    kv_bytes_per_token : keys and values of one token of one sequence, all layers, at the
        precision [B] (:func:`kv_elements_per_token` x bytes per KV element)
    gpus : GPUs the cache is split over [-]

    Returns
    -------
    bytes : ``ceil(kv_tokens_per_request * kv_bytes_per_token / gpus)`` [B]
    """
    return -(-serving.kv_tokens_per_request() * kv_bytes_per_token // gpus)


def kv_elements_per_token(step: GraphAnalysis, tensor: int = 1) -> int:
    """Keys and values cached per token of one sequence, all layers, on one rank of a
    ``tensor``-way tensor-parallel group [elements].

    ``step`` is the graph analysed at one sequence of one token (``batch = 1``, ``seq = 1``):
    each attention layer caches ``2 * kv_heads * head_dim`` elements per token, of which a
    rank holds ``kv_heads_per_rank(kv_heads, tensor)`` heads (app.domain.parallel: split while
    the group is no larger than the KV heads, one replicated head per rank past them, as vLLM's
    ``get_num_kv_heads``). A layer that does not say its KV heads is split evenly (rounded up).
    """
    total = 0
    for layer in step.layers:
        numel, kv_heads = layer.result.kv_cache_numel, layer.result.num_kv_heads
        if not numel:
            continue
        if kv_heads:
            total += numel // kv_heads * kv_heads_per_rank(kv_heads, tensor)
        else:
            total += -(-numel // tensor)
    return total


def max_concurrent_requests(
    budget_bytes: int, kv_bytes_per_request: int, *, limit: int | None = None
) -> int:
    """Requests whose KV cache fits in ``budget_bytes`` [-] (0 when not even one does).

    ``N = floor(budget / KV bytes per request)``, at most ``limit``.
    """
    if kv_bytes_per_request < 1:
        raise DecodingInputError("kv_bytes_per_request must be >= 1")
    found = max(budget_bytes, 0) // kv_bytes_per_request
    return found if limit is None else min(found, limit)


def serving_shape(
    prefill: GraphAnalysis,
    step: GraphAnalysis,
    *,
    requests: int,
    serving: DecoderServing,
    fuse_elementwise: bool = True,
) -> PhasedRequestShape:
    """A batch of ``requests`` decoder requests as the serving mode runs them.

    Parameters
    ----------
    prefill : the graph at the prefill's rows (static: ``requests x k`` rows, each beam its own
        copy of the prompt; continuous: ``requests`` rows, once per request) and
        ``seq = serving.priced_prompt_tokens``
    step : the graph at ``requests x k`` rows of one token
    requests : requests in flight together [-]
    serving : lengths, batching and beams

    Returns
    -------
    shape : a prefill, then ``serving.decode_steps`` decode steps over ``requests x k``
        sequences attending to ``serving.mean_context_tokens`` cached tokens each; ``batch`` is
        ``requests`` (throughput counts requests, not beams)

    Notes
    -----
    As :func:`app.domain.performance.phases.decoder_shape`, with the decode rows ``k`` times
    the requests and the lengths the batching prices. The host receives each decode row's
    token id (8 B) per step.
    """
    if requests < 1:
        raise DecodingInputError(f"requests must be >= 1, got {requests}")
    return decoder_shape(
        prefill,
        step,
        batch=requests,
        prompt_tokens=serving.priced_prompt_tokens,
        generated_tokens=serving.priced_generated_tokens,
        beam_width=serving.beam_width,
        shared_prompt_tokens=serving.shared_read_prompt_tokens,
        fuse_elementwise=fuse_elementwise,
    )
