"""What a GPU and a MIG slice show to CUDA: the catalog's measured figure, and the cap a whole
GPU's figure puts on its slices (hand-derived bytes)."""

from dataclasses import replace

from app.domain.hardware import DeviceKind, HardwareSpec, mig_slice, slice_cuda_visible_bytes
from app.domain.mig.layout import MigGeometry, MigProfileSpec
from app.domain.precision import DType
from app.domain.units import GIB, MIB

H100_SHOWN = 85_029_615_043  # round(79.19 x 2**30): the H100 80GB in vLLM 0.19's logs


def test_a_slice_listed_above_the_whole_gpus_figure_is_capped_by_it() -> None:
    # H100 80GB 7g.80gb: nvidia-smi mig -lgip lists 79.25 GiB = 81,152 MiB, the GPU shows 79.19
    listed = 81_152 * MIB
    assert listed == 85_094_039_552 > H100_SHOWN
    visible, source = slice_cuda_visible_bytes(H100_SHOWN, "vLLM logs", listed)
    assert visible == H100_SHOWN
    assert source == "at most what the whole GPU shows to CUDA (85,029,615,043 B: vLLM logs)"


def test_a_smaller_slice_or_an_unmeasured_gpu_keeps_the_catalog_memory() -> None:
    assert slice_cuda_visible_bytes(H100_SHOWN, "vLLM logs", 40_192 * MIB) == (None, None)
    assert slice_cuda_visible_bytes(H100_SHOWN, "vLLM logs", H100_SHOWN) == (None, None)
    assert slice_cuda_visible_bytes(None, None, 81_152 * MIB) == (None, None)


def test_mig_slice_carries_the_cap() -> None:
    gpu = HardwareSpec(
        slug="h100", name="H100", kind=DeviceKind.GPU, peak_flops_per_s={DType.BF16: 1e15},
        memory_bandwidth_bytes_per_s=3e12, memory_bytes=80 * GIB, host_link_bytes_per_s=None,
        host_link_source="", tdp_watts=700, price_usd_per_hour=None,
        cuda_visible_memory_bytes=H100_SHOWN, cuda_visible_memory_source="vLLM logs",
    )  # fmt: skip
    geometry = MigGeometry(
        gpu=gpu.slug,
        total_compute_slices=7,
        total_memory_slices=8,
        max_gpu_instances=7,
        profiles=(),
    )
    whole = MigProfileSpec(
        name="7g.80gb",
        memory_mib=81_152,
        compute_slices=7,
        memory_slices=8,
        max_instances=1,
        placements=(0,),
    )
    half = replace(whole, name="3g.40gb", memory_mib=40_192, compute_slices=3, memory_slices=4)
    capped = mig_slice(gpu, geometry, whole)
    assert capped.memory_bytes == 85_094_039_552
    assert capped.cuda_visible_memory_bytes == H100_SHOWN
    assert capped.cuda_visible_memory_source is not None
    assert capped.cuda_visible_memory_source.startswith("at most what the whole GPU shows")
    small = mig_slice(gpu, geometry, half)
    assert small.memory_bytes == 40_192 * MIB
    assert (small.cuda_visible_memory_bytes, small.cuda_visible_memory_source) == (None, None)
