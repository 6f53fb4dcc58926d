"""The shipped hardware catalog: valid, complete, and its JSON Schema is current."""

import json

import pytest

from app.cli import catalog_schema_document
from app.services.catalog import load_catalog
from tests.support import CATALOG_DIR

ENTRIES = {entry.slug: entry for entry in load_catalog(CATALOG_DIR)}

# Issue 2's device list, as catalog slugs.
REQUIRED = [
    "nvidia-v100-32gb-sxm2", "nvidia-t4", "nvidia-a10", "nvidia-a30", "nvidia-a100-40gb-sxm",
    "nvidia-a100-80gb-sxm", "nvidia-l4", "nvidia-l40s", "nvidia-h100-pcie", "nvidia-h100-sxm",
    "nvidia-h100-nvl", "nvidia-h200-sxm", "nvidia-gh200-96gb", "nvidia-gh200-144gb",
    "nvidia-b200", "nvidia-titan-x-maxwell", "nvidia-tegra-x1", "nvidia-jetson-agx-orin-64gb",
    "nvidia-jetson-orin-nano-8gb", "google-tpu-v3", "google-tpu-v4", "google-tpu-v5e",
    "intel-xeon-e5-2698-v3", "intel-xeon-platinum-8380", "intel-xeon-platinum-8480plus",
    "amd-epyc-9654", "aws-graviton3",
]  # fmt: skip

# Profiles per MIG GPU, from shared/reference/mig_profiles.yaml (golden).
MIG_PROFILE_COUNTS = {
    "nvidia-a30": 5,
    "nvidia-a100-40gb-pcie": 7,
    "nvidia-a100-40gb-sxm": 7,
    "nvidia-a100-80gb-pcie": 7,
    "nvidia-a100-80gb-sxm": 7,
    "nvidia-h100-pcie": 7,
    "nvidia-h100-sxm": 7,
    "nvidia-h100-nvl": 7,
    "nvidia-h200-sxm": 7,
    "nvidia-gh200-96gb": 7,
    "nvidia-gh200-144gb": 7,
    "nvidia-b200": 7,
}


def test_at_least_25_devices_and_every_required_one() -> None:
    assert len(ENTRIES) >= 25
    assert [slug for slug in REQUIRED if slug not in ENTRIES] == []


@pytest.mark.parametrize(("slug", "count"), sorted(MIG_PROFILE_COUNTS.items()))
def test_mig_gpus_carry_every_reference_profile(slug: str, count: int) -> None:
    mig = ENTRIES[slug].mig
    assert mig is not None
    assert len(mig.profiles) == count


def test_golden_mig_figures() -> None:
    a100_40 = ENTRIES["nvidia-a100-40gb-sxm"].mig
    assert a100_40 is not None
    one_g = next(p for p in a100_40.profiles if p.name == "1g.5gb")
    assert (one_g.memory_mib, one_g.max_instances, one_g.placements) == (4864, 7, list(range(7)))
    a30 = ENTRIES["nvidia-a30"].mig
    assert a30 is not None
    assert (a30.total_compute_slices, a30.total_memory_slices) == (4, 4)


# SMs per MIG profile, pinned from shared/reference/mig_profiles.yaml (NVIDIA's profile tables;
# golden, not derived: none of them is floor(GPU SMs x compute slices / total)). None: the
# reference gives no figure, so the slice falls back to that proportional approximation.
SmCounts = dict[str, int | None]
_A100_40: SmCounts = {"1g.5gb": 14, "1g.5gb+me": 14, "1g.10gb": 14, "2g.10gb": 28,
                      "3g.20gb": 42, "4g.20gb": 56, "7g.40gb": 98}  # fmt: skip
_A100_80: SmCounts = {"1g.10gb": 14, "1g.10gb+me": 14, "1g.20gb": 14, "2g.20gb": 28,
                      "3g.40gb": 42, "4g.40gb": 56, "7g.80gb": 98}  # fmt: skip
_H200: SmCounts = {"1g.18gb": 16, "1g.18gb+me": 16, "1g.35gb": 26, "2g.35gb": 32,
                   "3g.71gb": 60, "4g.71gb": 64, "7g.141gb": 132}  # fmt: skip
MIG_PROFILE_SM_COUNTS: dict[str, SmCounts] = {
    "nvidia-a30": {"1g.6gb": 14, "1g.6gb+me": 14, "2g.12gb": 28, "2g.12gb+me": 28,
                   "4g.24gb": 56},
    "nvidia-a100-40gb-pcie": _A100_40,
    "nvidia-a100-40gb-sxm": _A100_40,
    "nvidia-a100-80gb-pcie": _A100_80,
    "nvidia-a100-80gb-sxm": _A100_80,
    # the reference's H100 counts are the SXM5's (132 SMs); the PCIe card's are unpublished
    "nvidia-h100-pcie": {"1g.10gb": None, "1g.10gb+me": None, "1g.20gb": None, "2g.20gb": None,
                         "3g.40gb": None, "4g.40gb": None, "7g.80gb": None},
    "nvidia-h100-sxm": {"1g.10gb": 16, "1g.10gb+me": 16, "1g.20gb": 26, "2g.20gb": 32,
                        "3g.40gb": 60, "4g.40gb": 64, "7g.80gb": 132},
    "nvidia-h100-nvl": {"1g.12gb": 16, "1g.12gb+me": 16, "1g.24gb": 26, "2g.24gb": 32,
                        "3g.47gb": 60, "4g.47gb": 64, "7g.94gb": 132},
    "nvidia-h200-sxm": _H200,
    "nvidia-h200-nvl": _H200,
    "nvidia-gh200-96gb": {"1g.12gb": 16, "1g.12gb+me": 16, "1g.24gb": 26, "2g.24gb": 32,
                          "3g.48gb": 60, "4g.48gb": 64, "7g.96gb": 132},
    "nvidia-gh200-144gb": {"1g.18gb": 16, "1g.18gb+me": 16, "1g.36gb": 26, "2g.36gb": 32,
                           "3g.72gb": None, "4g.72gb": None, "7g.144gb": None},
    "nvidia-b200": {"1g.23gb": 18, "1g.23gb+me": 18, "1g.45gb": 30, "2g.45gb": 36,
                    "3g.90gb": None, "4g.90gb": None, "7g.180gb": None},
    "nvidia-rtx-pro-6000-blackwell": {
        "1g.24gb": 46, "1g.24gb+me": 46, "1g.24gb+gfx": 46, "1g.24gb+me.all": 46,
        "1g.24gb-me": 46, "2g.48gb": 94, "2g.48gb+gfx": 94, "2g.48gb+me.all": 94,
        "2g.48gb-me": 94, "4g.96gb": 188, "4g.96gb+gfx": 188,
    },
}  # fmt: skip


@pytest.mark.parametrize("slug", sorted(MIG_PROFILE_SM_COUNTS))
def test_mig_profiles_carry_the_reference_sm_counts(slug: str) -> None:
    mig = ENTRIES[slug].mig
    assert mig is not None
    assert {p.name: p.sm_count for p in mig.profiles} == MIG_PROFILE_SM_COUNTS[slug]


def test_every_mig_gpu_has_its_profile_sm_counts_pinned() -> None:
    mig_gpus = {slug for slug, entry in ENTRIES.items() if entry.mig is not None}
    assert mig_gpus == set(MIG_PROFILE_SM_COUNTS)


def test_no_mig_outside_mig_capable_gpus() -> None:
    assert ENTRIES["nvidia-t4"].mig is None
    assert ENTRIES["nvidia-l40s"].mig is None
    assert all(e.mig is None for e in ENTRIES.values() if e.kind.value != "gpu")


def test_units_are_plausible() -> None:
    for entry in ENTRIES.values():
        assert 2**28 <= entry.memory_bytes <= 2**42, entry.slug  # 256 MiB .. 4 TiB
        assert 10**9 <= entry.memory_bandwidth_bytes_per_s <= 10**13, entry.slug
        assert all(10**9 <= v <= 10**17 for v in entry.peak_flops_per_s.values()), entry.slug
        assert entry.sources, entry.slug


def test_every_cpu_marks_its_memory_as_unconfirmed() -> None:
    for entry in ENTRIES.values():
        if entry.kind.value == "cpu":
            assert "memory_bytes" in entry.unconfirmed, entry.slug
            assert entry.cpu is not None, entry.slug


def test_schema_json_is_current() -> None:
    committed = json.loads((CATALOG_DIR / "schema.json").read_text(encoding="utf-8"))
    assert committed == json.loads(catalog_schema_document()), (
        "hardware_catalog/schema.json is stale; run `capplan-server catalog-schema -o "
        "hardware_catalog/schema.json`"
    )


def test_every_nvidia_device_has_its_compute_capability_and_it_agrees_with_bf16() -> None:
    """NVIDIA's compute capability table, cited in each entry; bf16 hardware (a bf16 peak) only
    from compute capability 8.0 (Ampere), and every data-center GPU from 8.0 lists one (the
    Jetson SoCs' tables list only their int8 peak)."""
    nvidia = [e for e in ENTRIES.values() if e.vendor == "NVIDIA"]
    assert len(nvidia) >= 20
    for entry in nvidia:
        assert entry.compute_capability is not None, entry.slug
        assert "https://developer.nvidia.com/cuda-gpus" in entry.sources, entry.slug
        major = int(entry.compute_capability.split(".")[0])
        has_bf16 = any(dtype.value == "bf16" for dtype in entry.peak_flops_per_s)
        assert not has_bf16 or major >= 8, entry.slug
        if entry.kind.value == "gpu":
            assert has_bf16 == (major >= 8), entry.slug
    others = [e for e in ENTRIES.values() if e.vendor != "NVIDIA"]
    assert all(e.compute_capability is None for e in others)
    assert ENTRIES["nvidia-t4"].compute_capability == "7.5"
    assert ENTRIES["nvidia-v100-32gb-sxm2"].compute_capability == "7.0"
    assert ENTRIES["nvidia-a100-80gb-sxm"].compute_capability == "8.0"
    assert ENTRIES["nvidia-h100-sxm"].compute_capability == "9.0"
