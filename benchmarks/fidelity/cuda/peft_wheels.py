"""Make peft, accelerate and bitsandbytes importable on the GPU machine, whose image lacks them
(torch and transformers only, no network): unpack the wheels ``fetch_wheels.sh`` put in
``wheels/`` into a temporary folder appended to ``sys.path`` (a wheel is a zip of its installed
files and their ``.dist-info``; no pip, no index; the image's own packages win).

Torch-free, and run by ``measure.py --suite peft`` before it imports transformers:
transformers decides at import whether accelerate and bitsandbytes are installed (its
``is_accelerate_available`` is computed once), so a later unpacking would leave
``from_pretrained(device_map=...)`` and the 4-bit load refusing to run.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

NEEDED = ("peft", "accelerate", "bitsandbytes", "psutil")


def missing() -> list[str]:
    """The needed packages this interpreter cannot import."""
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def install_wheels(folder: Path) -> dict[str, str]:
    """Unpack every ``*.whl`` in ``folder`` into a temporary folder appended to ``sys.path``;
    returns the distribution name -> wheel file."""
    # torchtune's package needs torchao: peft_suite reads its offloading module from the wheel
    wheels = sorted(w for w in folder.glob("*.whl") if not w.name.startswith("torchtune-"))
    if not wheels:
        raise FileNotFoundError(
            f"no wheels in {folder}: run benchmarks/fidelity/cuda/fetch_wheels.sh here and "
            "carry benchmarks/fidelity/cuda/wheels to the device"
        )
    target = Path(tempfile.mkdtemp(prefix="capplan_wheels_"))
    atexit.register(shutil.rmtree, target, True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    for library in target.rglob("*.so"):
        library.chmod(0o755)
    sys.path.append(str(target))
    importlib.invalidate_caches()
    return {w.name.split("-")[0]: w.name for w in wheels}


def prepare(folder: Path) -> dict[str, object]:
    """Unpack the wheels when a needed package is missing; what was missing and unpacked."""
    lacking = missing()
    unpacked = install_wheels(folder) if lacking else {}
    return {"peft_suite_missing_on_image": lacking, "peft_suite_wheels": unpacked}


def early(argv: list[str], default_folder: Path) -> dict[str, object] | None:
    """``prepare`` when ``argv`` asks for ``--suite peft`` (``--wheels DIR`` or the default
    folder), before anything imports transformers; None for the base suite."""
    suite = _option(argv, "--suite")
    if suite != "peft" or "--list" in argv or any(a.startswith("--list-json") for a in argv):
        return None
    folder = _option(argv, "--wheels")
    return prepare(Path(folder) if folder else default_folder)


def _option(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None
