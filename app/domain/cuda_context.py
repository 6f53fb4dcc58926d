"""The CUDA context a PyTorch process holds on a GPU, by GPU generation, CUDA major version and
module loading: a table of published figures (issue 32).

The context is device memory outside PyTorch's caching allocator (``nvidia-smi``'s "used" minus
``torch.cuda.memory_reserved()``): the driver's per-context state and the loaded kernel images.
What decides its size is how the CUDA modules are loaded:

* eager loading (CUDA before 11.7, or ``CUDA_MODULE_LOADING=EAGER``): every kernel of every
  library linked in (PyTorch, cuBLAS, cuDNN) is loaded when the context is created; over
  1,000 MiB for the PyTorch 1.x binaries (ptrblck, pytorch/pytorch#107667: "before CUDA 11.7,
  all kernels were loaded into the context once the library was loaded, which took >1000MB").
* lazy loading (``CUDA_MODULE_LOADING=LAZY``): a module, and a kernel, is loaded at its first
  use. Introduced, off by default, in CUDA 11.7; on by default on Linux since CUDA 12.2 and on
  every platform since 12.3 (NVIDIA, CUDA C++ Programming Guide, "Lazy Loading", table "Select
  Lazy Loading Changes by CUDA Version",
  https://docs.nvidia.com/cuda/cuda-programming-guide/04-special-topics/lazy-loading.html).
  PyTorch sets ``CUDA_MODULE_LOADING=LAZY`` when the user has not set it since 1.13
  (pytorch/pytorch#86509), so every PyTorch >= 1.13 built with CUDA >= 11.7 loads lazily.

The table keys a figure by (loading, CUDA major version, compute capability); a lookup takes the
exact compute capability, then the generation (the major), then the loading and CUDA major's
figure for any GPU. The default (:data:`DEFAULT_CUDA_MAJOR`, lazy) is what a current PyTorch
wheel runs: CUDA 12, lazy loading. Every figure names its source; none is fitted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from app.domain.precision import ComputeCapability
from app.domain.units import MIB


class ModuleLoading(StrEnum):
    """How the CUDA runtime loads kernels (``CUDA_MODULE_LOADING``)."""

    LAZY = "lazy"
    EAGER = "eager"


DEFAULT_CUDA_MAJOR = 12  # PyTorch 2.x wheels are built with CUDA 12 (cu121 .. cu128)
DEFAULT_LOADING = ModuleLoading.LAZY  # PyTorch >= 1.13 sets LAZY; CUDA >= 12.2's own default
LAZY_FROM = (11, 7)  # CUDA version lazy loading first exists in (NVIDIA, "Lazy Loading")

_LAZY_DOC = (
    "NVIDIA CUDA C++ Programming Guide, 'Lazy Loading' (lazy since CUDA 11.7, default on Linux "
    "since 12.2); PyTorch sets CUDA_MODULE_LOADING=LAZY since 1.13 (pytorch/pytorch#86509)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextFigure:
    """One published CUDA context figure [B] and where it was read."""

    loading: ModuleLoading
    cuda_major: int
    capability: tuple[int, int] | None  # exact (major, minor); None: any GPU
    generation: int | None = None  # compute capability major, when not exact
    context_bytes: int
    gpu: str  # the GPU the figure was read on ("unnamed" when the source does not say)
    source: str


# fmt: off
CONTEXT_TABLE: tuple[ContextFigure, ...] = (
    # -- eager loading (CUDA < 11.7, or CUDA_MODULE_LOADING=EAGER) --------------------------
    ContextFigure(
        loading=ModuleLoading.EAGER, cuda_major=11, capability=(7, 0), context_bytes=1343 * MIB,
        gpu="V100 16 GB",
        source="issue 32 (the Hugging Face single-GPU training tables' empty V100 process: "
        "1,343 MiB NVML 'used', an eager-loading era stack)",
    ),
    ContextFigure(
        loading=ModuleLoading.EAGER, cuda_major=10, capability=None, generation=7,
        context_bytes=1005 * MIB, gpu="Titan V (sm70)",
        source="pytorch/pytorch#28394 (PyTorch 1.3, CUDA 10: 1,008.2 MiB used after a 24 B "
        "tensor, less 0.9 MiB before and the 2 MiB cached segment)",
    ),
    ContextFigure(
        loading=ModuleLoading.EAGER, cuda_major=11, capability=(8, 6), context_bytes=999 * MIB,
        gpu="RTX 3090",
        source="pytorch/pytorch#54564 (PyTorch 1.7, CUDA 11.1: 1,001 MiB used with one "
        "40 KB tensor, less its 2 MiB cached segment)",
    ),
    ContextFigure(
        loading=ModuleLoading.EAGER, cuda_major=11, capability=None, context_bytes=1343 * MIB,
        gpu="the largest published eager figure (V100)",
        source="issue 32's V100 (1,343 MiB), the largest eager-loading figure published; other "
        "GPUs: 636 MiB (pytorch/pytorch#86509, CUDA 11.7 eager, GPU unnamed) to 999 MiB "
        "(pytorch/pytorch#54564, RTX 3090)",
    ),
    ContextFigure(
        loading=ModuleLoading.EAGER, cuda_major=12, capability=None, context_bytes=1343 * MIB,
        gpu="no CUDA 12 eager figure published",
        source="no CUDA 12 eager-loading figure is published: CUDA 11's largest (issue 32's "
        "V100, 1,343 MiB)",
    ),
    # -- lazy loading (CUDA >= 11.7 with PyTorch >= 1.13; the default since CUDA 12.2) ------
    ContextFigure(
        loading=ModuleLoading.LAZY, cuda_major=11, capability=None, context_bytes=274 * MIB,
        gpu="unnamed",
        source="pytorch/pytorch#86509 (PyTorch 1.13, CUDA 11.7: 287,047,680 B lazy vs "
        "666,632,192 B eager)",
    ),
    ContextFigure(
        loading=ModuleLoading.LAZY, cuda_major=12, capability=(8, 6), context_bytes=256 * MIB,
        gpu="RTX 3090",
        source="invoke-ai/InvokeAI#9413 (torch 2.7.1+cu128: a bare context holds 256 MiB)",
    ),
    ContextFigure(
        loading=ModuleLoading.LAZY, cuda_major=13, capability=(9, 0), context_bytes=767 * MIB,
        gpu="H100 80GB HBM3",
        source="measured here, benchmarks/fidelity/cuda/cuda_measurements_3.json (2026-11-28, "
        "torch 2.11.0+cu130, driver 580.159.04: a fresh process training Llama-3-8B-2L holds "
        "767-783 MiB beyond its reservation; cuda_probes.json: 527 MiB after init, 619 after "
        "the first kernel, 685 after cuBLAS, 693 after cuDNN, 695 after SDPA); the same stack "
        "on an H200 (sm90, 141 GB; cuda_measurements_h200_1.json): 552,402,944 B at start as "
        "on the H100, 687-765 MiB in the same 277 runs",
    ),
    ContextFigure(
        loading=ModuleLoading.LAZY, cuda_major=12, capability=None, context_bytes=400 * MIB,
        gpu="unnamed",
        source="ptrblck, pytorch/pytorch#109888 (2023: 'around 400MB if CUDA >= 11.7 is used "
        "and lazy module loading enabled'), the largest lazy figure published, read as MiB",
    ),
)
# fmt: on


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextChoice:
    """The CUDA context an estimate charges [B], the table row it came from and why."""

    context_bytes: int
    figure: ContextFigure
    assumption: str  # what the lookup assumed (loading, CUDA major, the GPU's match)

    @property
    def source(self) -> str:
        """The figure's source, for the cuda_context line's formula."""
        return f"CUDA context table: {self.figure.source}"


def loading_for(cuda_version: tuple[int, int]) -> ModuleLoading:
    """The loading a PyTorch >= 1.13 process gets with a CUDA ``(major, minor)``: lazy from
    11.7 (PyTorch sets CUDA_MODULE_LOADING=LAZY), eager before."""
    return ModuleLoading.LAZY if cuda_version >= LAZY_FROM else ModuleLoading.EAGER


def cuda_context(
    capability: ComputeCapability | None,
    *,
    cuda_major: int = DEFAULT_CUDA_MAJOR,
    loading: ModuleLoading = DEFAULT_LOADING,
) -> ContextChoice:
    """The CUDA context of a PyTorch process on a GPU of compute ``capability`` (None: not
    known), CUDA ``cuda_major`` and ``loading`` [B].

    Lookup: the row of the exact compute capability, then of its generation (the major), at
    that CUDA major, then at the older CUDA majors (newest first), then the row for any GPU of
    that loading and CUDA major; a CUDA major with no row takes the nearest one below (above
    when none is below). Lazy CUDA 10 does not exist (lazy loading
    starts at 11.7): it is read as eager.
    """
    if loading is ModuleLoading.LAZY and cuda_major < LAZY_FROM[0]:
        loading = ModuleLoading.EAGER
    majors = sorted({f.cuda_major for f in CONTEXT_TABLE if f.loading is loading})
    below = [m for m in majors if m <= cuda_major]
    major = below[-1] if below else majors[0]
    rows = [f for f in CONTEXT_TABLE if f.loading is loading and f.cuda_major == major]
    cap = (capability.major, capability.minor) if capability is not None else None
    exact = [f for f in rows if cap is not None and f.capability == cap]
    generation = [f for f in rows if cap is not None and f.generation == cap[0]]
    for older in reversed([m for m in majors if m < major]):  # the GPU's own row of an older
        if exact or generation or cap is None:  # CUDA before the any-GPU one of this major
            break
        earlier = [f for f in CONTEXT_TABLE if f.loading is loading and f.cuda_major == older]
        exact = [f for f in earlier if f.capability == cap]
        generation = [f for f in earlier if f.generation == cap[0]]
    anyone = [f for f in rows if f.capability is None and f.generation is None] or sorted(
        (
            f
            for f in CONTEXT_TABLE
            if f.loading is loading and f.capability is None and f.generation is None
        ),
        key=lambda f: abs(f.cuda_major - major),
    )
    figure, match = (
        (exact[0], f"sm{cap[0]}{cap[1]}'s own figure")
        if exact and cap
        else (generation[0], f"compute capability {cap[0]}.x's figure")
        if generation and cap
        else (anyone[0], "no figure for this GPU: the figure for any GPU")
    )
    stack = f"CUDA {cuda_major}" + ("" if major == cuda_major else f" (CUDA {major}'s figures)")
    gpu = "GPU of unknown compute capability" if capability is None else f"sm{capability.sm[2:]}"
    assumption = (
        f"CUDA context {figure.context_bytes / MIB:,.0f} MiB: {loading.value} module loading, "
        f"{stack}, {gpu}: {match} ({figure.gpu}); {_LAZY_DOC}"
    )
    return ContextChoice(context_bytes=figure.context_bytes, figure=figure, assumption=assumption)
