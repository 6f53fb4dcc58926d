"""Peak memory of an ONNX import: the file with its weights vs a graph-only copy.

Run: .venv/bin/python benchmarks/import_memory.py [--mib 90]

Builds an MLP whose float weights take about ``--mib`` MiB, serialises it with its weights and
without them (dims only), and imports each in a fresh subprocess (Linux only), reporting the
resident memory just before ``import_onnx`` (the upload already read, as the server holds it)
and its peak during the import (``VmHWM`` after resetting it with ``/proc/self/clear_refs``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

# Linux: VmRSS now, VmHWM the peak since the last reset (writing 5 to clear_refs resets it).
CHILD = """
import sys
from app.importers.onnx_model import import_onnx
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1])
data = open(sys.argv[1], 'rb').read()
open('/proc/self/clear_refs', 'w').write('5')
before = status('VmRSS:')
imported = import_onnx(data)
after = status('VmHWM:')
print(before, after, imported.parameter_count)
"""


def build(mib: int, weights: bool) -> bytes:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    width = 2048
    layers = max(1, mib * 2**20 // (width * width * 4))
    nodes, inits = [], []
    current = "x"
    for i in range(layers):
        w = np.random.default_rng(i).standard_normal((width, width), dtype=np.float32)
        tensor = numpy_helper.from_array(w, f"w{i}")
        if not weights:
            tensor.ClearField("raw_data")
        inits.append(tensor)
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        current = f"r{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info(current, TensorProto.FLOAT, ["batch", width])
    graph = helper.make_graph(nodes, "mlp", [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=90)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    print(f"{'file':<14} {'size MiB':>9} {'RSS before MiB':>15} {'peak after MiB':>15} "
          f"{'increase / size':>16}")  # fmt: skip
    for label, weights in (("with weights", True), ("graph only", False)):
        data = build(args.mib, weights)
        with tempfile.NamedTemporaryFile(suffix=".onnx") as handle:
            handle.write(data)
            handle.flush()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, handle.name],
                cwd=root, capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
        before, after = int(out[0]) / 1024, int(out[1]) / 1024
        size = len(data) / 2**20
        ratio = f"{(after - before) / size:>15.1f}x" if size >= 1 else f"{'-':>16}"
        print(f"{label:<14} {size:>9.2f} {before:>15.0f} {after:>15.0f} {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
