"""Devices from the command line: ``--gpu`` by slug or name (with its memory size), a MIG
slice as ``slug/profile``, and what a listed GPU can run.
"""

from __future__ import annotations

import re

from app.client.cli_output import GIB, UsageError, gib
from app.client.transport import Json, JsonClient

_MEMORY_PART = re.compile(r"^(\d+(?:\.\d+)?)gb$")
MEMORY_TOLERANCE = 0.03  # "80gb" names 80 GiB or 80 GB, give or take 3 %


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9.]+", text.lower()) if w]


def _memory_matches(memory_bytes: int, size: float) -> bool:
    return any(
        abs(memory_bytes - size * unit) <= MEMORY_TOLERANCE * size * unit for unit in (GIB, 10**9)
    )


def resolve_gpu(items: list[Json], query: str) -> str:
    """The hardware slug ``query`` names, or a UsageError listing the candidates.

    An exact slug or an exact part name (``L4``, ``H100 SXM5 80GB``, with or without the
    vendor) wins. Otherwise every ``-``-separated part must be a whole word of the slug or the
    name (``l4`` is not ``l40s``), and a part like ``94gb`` must match the memory size.
    """
    wanted = query.strip().lower()
    for item in items:
        if wanted == item["slug"]:
            return str(item["slug"])
    joined = "-".join(_words(wanted))
    exact = [
        item["slug"]
        for item in items
        if joined in {"-".join(_words(item["name"])),
                      "-".join(_words(f"{item['vendor']} {item['name']}"))}
    ]  # fmt: skip
    if len(exact) == 1:
        return str(exact[0])
    parts = _words(wanted.replace("-", " "))
    sizes = [float(m.group(1)) for p in parts if (m := _MEMORY_PART.match(p))]
    names = [p for p in parts if not _MEMORY_PART.match(p)]

    def named(item: Json, prefix: bool) -> bool:
        words = set(_words(item["slug"].replace("-", " "))) | set(_words(item["name"]))
        words |= set(_words(item["vendor"]))
        if prefix:
            return all(any(w.startswith(p) for w in words) for p in names)
        return all(p in words for p in names)

    for prefix in (False, True):  # whole words first: "l4" never falls through to "l40s"
        by_name = [item for item in items if named(item, prefix)]
        if by_name:
            break
    matches = [i for i in by_name if all(_memory_matches(i["memory_bytes"], s) for s in sizes)]
    if len(matches) == 1:
        return str(matches[0]["slug"])
    listed = matches or by_name
    candidates = ", ".join(f"{i['slug']} ({gib(i['memory_bytes'])})" for i in listed[:12])
    if not listed:
        raise UsageError(f"no hardware matches '{query}'; 'capplan hardware list' lists them")
    if not matches:
        raise UsageError(
            f"no hardware matches '{query}': the memory size does not match; candidates: "
            f"{candidates}"
        )
    raise UsageError(f"'{query}' is ambiguous: {candidates}")


def _resolve_gpu(client: JsonClient, query: str) -> str:
    return resolve_gpu(client.list_hardware(limit=500)["items"], query)


def _resolve_device(client: JsonClient, query: str) -> str:
    """``query`` as ``slug`` or ``slug/profile`` (one MIG slice, as recommend takes it): the
    part before ``/`` is resolved like --gpu, the profile is passed on for the server to check."""
    name, slash, profile = query.partition("/")
    slug = _resolve_gpu(client, name)
    return f"{slug}/{profile.strip()}" if slash else slug


# What each precision needs of a GPU: the lowest compute capability with hardware for its
# dtypes, and the peaks its math can run at. The server's rule (app.domain.precision.cannot_run),
# restated because the CLI runs without the server's packages; a test checks the two agree.
PRECISION_NEEDS: dict[str, tuple[tuple[int, int] | None, tuple[str, ...]]] = {
    "fp32": (None, ("fp32",)),
    "tf32": ((8, 0), ("tf32",)),
    "bf16": ((8, 0), ("bf16",)),
    "fp16": (None, ("fp16",)),
    "amp_bf16": ((8, 0), ("bf16",)),
    "amp_fp16": (None, ("fp16",)),
    "mixed_bf16": ((8, 0), ("bf16",)),
    "mixed_fp16": (None, ("fp16",)),
    "fp8": ((8, 9), ("fp8",)),
    "int8": (None, ("int8",)),
    "int8_weight_only": (None, ("fp16", "bf16")),
    "int4": (None, ("fp16", "bf16")),
    "fp4": ((10, 0), ("fp4",)),
}


def runs_precision(item: Json, precision: str) -> bool:
    """Whether a listed hardware item can run ``precision``: its compute capability is high
    enough and its peak table lists one of the precision's compute dtypes (the server's rule
    for the MIG fit's larger GPUs)."""
    needs = PRECISION_NEEDS.get(precision)
    if needs is None:
        return True  # a precision this CLI does not know: the server decides
    lowest, dtypes = needs
    text = item.get("compute_capability")
    if lowest is not None and text:
        major, _, minor = str(text).partition(".")
        if major.isdigit() and minor.isdigit() and (int(major), int(minor)) < lowest:
            return False
    return any(dtype in (item.get("peak_flops_per_s") or {}) for dtype in dtypes)


def _mig_capable(item: Json) -> bool:
    """A hardware item (``mig``) or a server-listed larger GPU (``mig_capable``)."""
    return bool(item["mig_capable"]) if "mig_capable" in item else item.get("mig") is not None
