"""Probe: the buffer a oneDNN convolution holds in its forward on CPU, against its input and
output (the rule of app.domain.memory.liveness._onednn_buffer).

Each case runs one ``torch.no_grad()`` forward of a bias-free convolution (fp32, after a
warm-up call) under :class:`memtrack.ProfilerTimeline` and prints the peak of live bytes beyond
the region's start, minus the output, as a multiple of the input and of the output. Run with
this folder's venv (torch 2.13.0 CPU), from this folder:

    .venv/bin/python conv_buffer_probe.py

The output of one run is in README.md ("oneDNN convolution"). A few seconds; 2 threads.
"""

from __future__ import annotations

import torch
from memtrack import ProfilerTimeline
from torch import nn

CASES: list[tuple[str, nn.Module, tuple[int, ...]]] = [
    ("dw 3x3 s2 96ch 112->56", nn.Conv2d(96, 96, 3, 2, 1, groups=96, bias=False),
     (8, 96, 112, 112)),
    ("dw 3x3 s1 96ch 56", nn.Conv2d(96, 96, 3, 1, 1, groups=96, bias=False), (8, 96, 56, 56)),
    ("dw 3x3 s1 32ch 112", nn.Conv2d(32, 32, 3, 1, 1, groups=32, bias=False), (8, 32, 112, 112)),
    ("3x3 s2 64->128 56->28", nn.Conv2d(64, 128, 3, 2, 1, bias=False), (8, 64, 56, 56)),
    ("3x3 s1 64->64 56", nn.Conv2d(64, 64, 3, 1, 1, bias=False), (8, 64, 56, 56)),
    ("1x1 s2 256->512 56->28", nn.Conv2d(256, 512, 1, 2, 0, bias=False), (8, 256, 56, 56)),
    ("1x1 s1 16->96 112", nn.Conv2d(16, 96, 1, 1, 0, bias=False), (8, 16, 112, 112)),
    ("1x1 s1 96->16 112", nn.Conv2d(96, 16, 1, 1, 0, bias=False), (8, 96, 112, 112)),
    ("7x7 s2 3->64 224->112", nn.Conv2d(3, 64, 7, 2, 3, bias=False), (8, 3, 224, 224)),
    ("3d 3^3 s1 32->32 32^3", nn.Conv3d(32, 32, 3, 1, 1, bias=False), (2, 32, 32, 32, 32)),
    ("3d 3^3 s2 32->64 64^3->32^3", nn.Conv3d(32, 64, 3, 2, 1, bias=False), (2, 32, 64, 64, 64)),
    ("3d 1^3 s1 32->3 32^3", nn.Conv3d(32, 3, 1, 1, 0, bias=False), (2, 32, 32, 32, 32)),
    ("3d 3^3 s1 1->32 32^3", nn.Conv3d(1, 32, 3, 1, 1, bias=False), (2, 1, 32, 32, 32)),
    ("3d^T 2^3 s2 64->32 16^3->32^3", nn.ConvTranspose3d(64, 32, 2, 2, bias=False),
     (2, 64, 16, 16, 16)),
    ("3d^T 2^3 s2 256->32 16^3->32^3", nn.ConvTranspose3d(256, 32, 2, 2, bias=False),
     (2, 256, 16, 16, 16)),
]  # fmt: skip


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    print("| conv | input B | output B | peak - output B | / input | / output |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, conv, shape in CASES:
        conv.eval()
        x = torch.randn(*shape)
        with torch.no_grad():
            conv(x)  # warm-up: oneDNN's primitive cache
            with ProfilerTimeline() as timeline:
                y = conv(x)
        assert timeline.result is not None
        in_bytes, out_bytes = x.numel() * 4, y.numel() * 4
        beyond = timeline.result.peak_extra - out_bytes
        print(
            f"| {name} | {in_bytes:,} | {out_bytes:,} | {beyond:,} | {beyond / in_bytes:.3f} "
            f"| {beyond / out_bytes:.3f} |"
        )
        del y


if __name__ == "__main__":
    main()
