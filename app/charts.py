"""SVG charts, hand-written (stdlib only): a log-log roofline and a memory-breakdown bar chart.

Both functions take plain numbers and labels and return a standalone SVG document; every
text is XML-escaped. Colours come from a fixed palette so the same request draws the same
picture.
"""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

from app.domain.units import GIB

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
FONT = 'font-family="Helvetica, Arial, sans-serif"'


def _text(
    x: float, y: float, content: str, *, size: int = 12, anchor: str = "start", **extra: str
) -> str:
    attrs = "".join(f' {k.replace("_", "-")}="{escape(v)}"' for k, v in extra.items())
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{attrs}>'
        f"{escape(content)}</text>"
    )


def _si(value: float, unit: str) -> str:
    """1e12 -> '1 T' + unit; 0.01 -> '0.01' + unit."""
    for power, prefix in ((15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if value >= 10**power:
            return f"{value / 10**power:.4g} {prefix}{unit}".strip()
    return f"{value:.4g} {unit}".strip()


def _document(width: int, height: int, title: str, body: list[str]) -> str:
    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" {FONT}>',
            f"<title>{escape(title)}</title>",
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
            *body,
            "</svg>",
        ]
    )


# --------------------------------------------------------------------------------------------
# Roofline
# --------------------------------------------------------------------------------------------


class ChartInputError(ValueError):
    """Numbers a chart cannot draw (zero, negative, subnormal or not finite on a log axis)."""


def _drawable(value: float) -> bool:
    """Whether ``value`` has a finite logarithm that is not absurd: a finite normal float > 0."""
    return isinstance(value, int | float) and math.isfinite(value) and value >= sys.float_info.min


@dataclass(frozen=True, slots=True, kw_only=True)
class Roof:
    """One device's roofline: attainable FLOP/s = min(peak, intensity x bandwidth)."""

    label: str
    peak_flops_per_s: float  # calibrated (effective)
    bandwidth_bytes_per_s: float
    spec_peak_flops_per_s: float  # catalog, drawn dashed
    spec_bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        # Drawn on log axes and divided by: each must be a positive, finite, normal number.
        for name in (
            "peak_flops_per_s",
            "bandwidth_bytes_per_s",
            "spec_peak_flops_per_s",
            "spec_bandwidth_bytes_per_s",
        ):
            value = getattr(self, name)
            if not _drawable(value):
                raise ChartInputError(
                    f"roof '{self.label}': {name} must be a positive, finite number of at least "
                    f"{sys.float_info.min:g}, got {value!r}"
                )
        if not _drawable(self.ridge_flops_per_byte):
            raise ChartInputError(f"roof '{self.label}': the ridge point is out of range")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Where the bandwidth slope meets the peak."""
        return self.peak_flops_per_s / self.bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class RoofPoint:
    """A kernel at its operational intensity and achieved rate on one of the roofs."""

    roof: int  # index into the roofs
    label: str
    intensity_flops_per_byte: float
    achieved_flops_per_s: float
    decode: bool = False  # drawn as a triangle


@dataclass(frozen=True, slots=True)
class _LogAxis:
    low: int  # decade exponents
    high: int
    start: float  # pixels
    end: float

    @classmethod
    def around(cls, values: Sequence[float], start: float, end: float) -> _LogAxis:
        positive = [v for v in values if v > 0 and math.isfinite(v)]
        low = math.floor(math.log10(min(positive)))
        high = math.ceil(math.log10(max(positive)))
        return cls(low, max(high, low + 1), start, end)

    def __call__(self, value: float) -> float:
        fraction = (math.log10(value) - self.low) / (self.high - self.low)
        return self.start + fraction * (self.end - self.start)

    @property
    def decades(self) -> range:
        return range(self.low, self.high + 1)


def _roof_path(roof: Roof, peak: float, bandwidth: float, x: _LogAxis, y: _LogAxis) -> str:
    """The two segments of a roofline, clipped to the plot."""
    x_min, x_max = 10.0**x.low, 10.0**x.high
    y_min = 10.0**y.low
    start = max(x_min, y_min / bandwidth)
    ridge = min(max(peak / bandwidth, start), x_max)
    points = [(start, bandwidth * start), (ridge, min(peak, bandwidth * ridge)), (x_max, peak)]
    return " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in points)


def roofline_svg(
    *, title: str, subtitle: str, roofs: Sequence[Roof], points: Sequence[RoofPoint]
) -> str:
    """A log-log roofline: one roof per device (solid: calibrated; dashed: catalog peak and
    bandwidth) with its ridge point marked, and the model's kernels as points."""
    if not roofs:
        raise ChartInputError("no roofs to draw")
    # A kernel with no DRAM traffic has infinite intensity; one that does nothing has no rate.
    points = [
        p
        for p in points
        if _drawable(p.intensity_flops_per_byte) and _drawable(p.achieved_flops_per_s)
    ]
    width, height = 1120, 640
    notes = textwrap.wrap(subtitle, 150)
    left, right, top, bottom = 110, 760, 56 + 16 * len(notes), 556
    intensities = [p.intensity_flops_per_byte for p in points] + [
        r.ridge_flops_per_byte for r in roofs
    ]
    x = _LogAxis.around([min(intensities) / 3, max(intensities) * 3], left, right)
    rates = [p.achieved_flops_per_s for p in points] + [
        r.spec_peak_flops_per_s * 1.5 for r in roofs
    ]
    floor = min([min(r.bandwidth_bytes_per_s * 10.0**x.low for r in roofs), *rates, min(rates) / 3])
    y = _LogAxis.around([max(floor, max(rates) / 1e7), max(rates)], bottom, top)
    body = [
        _text(width / 2, 28, title, size=18, anchor="middle", font_weight="bold"),
        *(
            _text(width / 2, 48 + 16 * i, line, size=12, anchor="middle", fill="#444")
            for i, line in enumerate(notes)
        ),
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
        'fill="none" stroke="#333"/>',
    ]
    for decade in x.decades:
        px = x(10.0**decade)
        body.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{bottom}" stroke="#ddd"/>')
        body.append(_text(px, bottom + 18, _si(10.0**decade, ""), anchor="middle"))
    for decade in y.decades:
        py = y(10.0**decade)
        body.append(f'<line x1="{left}" y1="{py:.1f}" x2="{right}" y2="{py:.1f}" stroke="#ddd"/>')
        body.append(_text(left - 6, py + 4, _si(10.0**decade, "FLOP/s"), anchor="end"))
    body.append(
        _text(
            (left + right) / 2,
            bottom + 42,
            "operational intensity [FLOP/byte of DRAM traffic]",
            size=13,
            anchor="middle",
        )
    )
    body.append(
        f'<text x="18" y="{(top + bottom) / 2:.1f}" font-size="13" text-anchor="middle" '
        f'transform="rotate(-90 18 {(top + bottom) / 2:.1f})">attainable performance '
        "[FLOP/s]</text>"
    )
    body.append(
        f'<clipPath id="plot"><rect x="{left}" y="{top}" width="{right - left}" '
        f'height="{bottom - top}"/></clipPath>'
    )
    body.append('<g clip-path="url(#plot)">')
    for index, roof in enumerate(roofs):
        colour = PALETTE[index % len(PALETTE)]
        spec = _roof_path(roof, roof.spec_peak_flops_per_s, roof.spec_bandwidth_bytes_per_s, x, y)
        calibrated = _roof_path(roof, roof.peak_flops_per_s, roof.bandwidth_bytes_per_s, x, y)
        body.append(
            f'<polyline points="{spec}" fill="none" stroke="{colour}" stroke-width="1.2" '
            'stroke-dasharray="5,4" opacity="0.6"/>'
        )
        body.append(
            f'<polyline points="{calibrated}" fill="none" stroke="{colour}" stroke-width="2.2"/>'
        )
        ridge = roof.ridge_flops_per_byte
        rx, ry = x(ridge), y(roof.peak_flops_per_s)
        body.append(
            f'<circle cx="{rx:.1f}" cy="{ry:.1f}" r="5" fill="white" stroke="{colour}" '
            'stroke-width="2"/>'
        )
        body.append(
            _text(rx + 7, ry - 7 - 13 * index, f"ridge {ridge:.3g} FLOP/B", size=11, fill=colour)
        )
    for point in points:
        colour = PALETTE[point.roof % len(PALETTE)]
        px, py = x(point.intensity_flops_per_byte), y(point.achieved_flops_per_s)
        tip = (
            f"{point.label}: {point.intensity_flops_per_byte:.3g} FLOP/B, "
            f"{_si(point.achieved_flops_per_s, 'FLOP/s')}"
        )
        if point.decode:
            shape = (
                f'<polygon points="{px:.1f},{py - 4.5:.1f} {px - 4:.1f},{py + 3:.1f} '
                f'{px + 4:.1f},{py + 3:.1f}"'
            )
        else:
            shape = f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.2"'
        body.append(
            f'{shape} fill="{colour}" fill-opacity="0.55" stroke="{colour}">'
            f"<title>{escape(tip)}</title></{shape.split()[0][1:]}>"
        )
    body.append("</g>")
    legend_x, legend_y = right + 20, top + 10
    body.append(_text(legend_x, legend_y, "Legend", size=13, font_weight="bold"))
    row = legend_y + 22
    for index, roof in enumerate(roofs):
        colour = PALETTE[index % len(PALETTE)]
        body.append(
            f'<line x1="{legend_x}" y1="{row - 4}" x2="{legend_x + 26}" y2="{row - 4}" '
            f'stroke="{colour}" stroke-width="2.2"/>'
        )
        label = textwrap.wrap(roof.label, 42)
        for offset, line in enumerate(label):
            body.append(_text(legend_x + 32, row + 13 * offset, line, size=11))
        row += 13 * (len(label) - 1)
        body.append(
            _text(
                legend_x + 32,
                row + 14,
                f"{_si(roof.peak_flops_per_s, 'FLOP/s')}, {_si(roof.bandwidth_bytes_per_s, 'B/s')}",
                size=10,
                fill="#555",
            )
        )
        row += 36
    notes = [
        "solid: calibrated roof (peak x efficiency)",
        "dashed: catalog peak and bandwidth",
        "circle on a roof: its ridge point",
        "dots: the model's kernels (fused layers)",
        "triangles: decode-step kernels",
        "achieved rate includes launch overhead",
    ]
    for note in notes:
        body.append(_text(legend_x, row, note, size=10, fill="#333"))
        row += 15
    return _document(width, height, title, body)


# --------------------------------------------------------------------------------------------
# Memory breakdown
# --------------------------------------------------------------------------------------------


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if factor * magnitude >= raw:
            return factor * magnitude
    return 10 * magnitude


def breakdown_svg(
    *,
    title: str,
    subtitle: str,
    lines: Sequence[tuple[str, int]],
    total_bytes: int,
    capacity_bytes: int | None = None,
    capacity_label: str = "",
) -> str:
    """Horizontal bars, one per breakdown line, and the total, labelled in GiB; a dashed line
    at the device's memory when one is given."""
    shown = [(key, size) for key, size in lines if size > 0]
    width = 900
    left, right, top = 190, 760, 80
    bar, gap = 20, 8
    bottom = top + (len(shown) + 1) * (bar + gap) + 10
    height = bottom + 70
    largest = max([total_bytes, capacity_bytes or 0, 1]) / GIB
    step = _nice_step(largest)
    limit = math.ceil(largest / step) * step

    def px(gib: float) -> float:
        return left + gib / limit * (right - left)

    body = [
        _text(width / 2, 28, title, size=18, anchor="middle", font_weight="bold"),
        _text(width / 2, 50, subtitle, size=12, anchor="middle", fill="#444"),
    ]
    tick = 0.0
    while tick <= limit + 1e-9:
        body.append(
            f'<line x1="{px(tick):.1f}" y1="{top - 6}" x2="{px(tick):.1f}" y2="{bottom}" '
            'stroke="#ddd"/>'
        )
        body.append(_text(px(tick), bottom + 18, f"{tick:g}", anchor="middle"))
        tick += step
    body.append(_text((left + right) / 2, bottom + 42, "memory [GiB]", size=13, anchor="middle"))
    y = float(top)
    rows = [*shown, ("total (peak)", total_bytes)]
    for index, (key, size) in enumerate(rows):
        is_total = index == len(rows) - 1
        colour = "#333" if is_total else PALETTE[index % len(PALETTE)]
        gib = size / GIB
        body.append(
            _text(
                left - 8,
                y + bar * 0.7,
                key,
                anchor="end",
                font_weight="bold" if is_total else "normal",
            )
        )
        body.append(
            f'<rect x="{left}" y="{y:.1f}" width="{max(px(gib) - left, 1):.1f}" height="{bar}" '
            f'fill="{colour}" fill-opacity="0.8"><title>{escape(key)}: {size:,} B</title></rect>'
        )
        body.append(_text(px(gib) + 6, y + bar * 0.7, f"{gib:.3f} GiB", size=11))
        y += bar + gap
    if capacity_bytes is not None:
        cx = px(capacity_bytes / GIB)
        body.append(
            f'<line x1="{cx:.1f}" y1="{top - 10}" x2="{cx:.1f}" y2="{bottom}" stroke="#d62728" '
            'stroke-width="2" stroke-dasharray="6,4"/>'
        )
        body.append(
            _text(
                cx,
                top - 14,
                f"{capacity_label} {capacity_bytes / GIB:.3g} GiB",
                size=11,
                anchor="middle",
                fill="#d62728",
            )
        )
    return _document(width, height, title, body)
