"""SVG charts, hand-written (stdlib only): a log-log roofline and a memory-breakdown bar chart.

Both functions take plain numbers and labels and return a standalone SVG document; every
text is XML-escaped. Colours come from a fixed palette so the same request draws the same
picture.
"""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Collection, Mapping, Sequence
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


# Text extents, approximated deterministically (no font metrics): Helvetica's average advance is
# about 0.55 em for digits and lower case; 0.62 em over-estimates it so that boxes that do not
# overlap here do not overlap on screen either.
CHAR_WIDTH_EM = 0.62
ASCENT_EM = 0.8
DESCENT_EM = 0.25
Box = tuple[float, float, float, float]  # left, top, right, bottom [px]


def text_box(x: float, y: float, content: str, *, size: int, anchor: str = "start") -> Box:
    """The box (left, top, right, bottom) a ``<text>`` at baseline ``(x, y)`` covers, at most."""
    width = CHAR_WIDTH_EM * size * len(content)
    left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
    return left, y - ASCENT_EM * size, left + width, y + DESCENT_EM * size


def boxes_overlap(a: Box, b: Box) -> bool:
    """Whether two (left, top, right, bottom) boxes share any area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


_BINDING_NAMES = {"seq": "sequence length", "image": "image size"}


def binding_phrases(
    bindings: Mapping[str, int], *, skip: Collection[str] = ("batch",)
) -> list[str]:
    """'sequence length 2048', 'image size 224', '<dim> <value>': bindings for a chart title."""
    return [
        f"{_BINDING_NAMES.get(name, name)} {value}"
        for name, value in bindings.items()
        if name not in skip
    ]


def _title_lines(title: str, width: int, size: int = 18) -> list[str]:
    """The title wrapped to the chart's width (by the same text-extent estimate)."""
    return textwrap.wrap(title, max(20, int((width - 40) / (CHAR_WIDTH_EM * size))))


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


RIDGE_LABEL_SIZE = 11
RIDGE_MARK_RADIUS = 5
LABEL_GAP = 7  # from a mark to its label's corner


def place_labels(
    marks: Sequence[tuple[float, float]],
    labels: Sequence[str],
    *,
    size: int,
    bounds: tuple[float, float, float, float],
    mark_radius: float = 0.0,
) -> list[tuple[float, float, str]]:
    """Baseline and anchor of each label near its mark, no two overlapping (by ``text_box``),
    and none covering a mark (a circle of ``mark_radius``, its stroke included).

    A label goes up and to the right of its mark; when that spot is taken (or outside
    ``bounds``), it moves up or down by a line at a time, first to the right, then to the left
    of the mark, and takes the nearest free spot. Deterministic: same marks, same picture."""
    left, top, right, bottom = bounds
    step = (ASCENT_EM + DESCENT_EM) * size + 2
    rows = int((bottom - top) / step) + 1
    r = mark_radius
    taken: list[Box] = [(mx - r, my - r, mx + r, my + r) for mx, my in marks] if r > 0 else []
    placed: list[tuple[float, float, str]] = []
    for (mx, my), label in zip(marks, labels, strict=True):
        candidates = [
            (mx + LABEL_GAP, my - LABEL_GAP + k * step, "start") for k in _nearest_first(rows)
        ] + [(mx - LABEL_GAP, my - LABEL_GAP + k * step, "end") for k in _nearest_first(rows)]
        chosen = candidates[0]
        for lx, ly, anchor in candidates:
            box = text_box(lx, ly, label, size=size, anchor=anchor)
            inside = box[0] >= left and box[2] <= right and box[1] >= top and box[3] <= bottom
            if inside and not any(boxes_overlap(box, other) for other in taken):
                chosen = (lx, ly, anchor)
                break
        taken.append(text_box(chosen[0], chosen[1], label, size=size, anchor=chosen[2]))
        placed.append(chosen)
    return placed


def _nearest_first(rows: int) -> list[int]:
    """0, -1, 1, -2, 2, ... (line offsets, up first)."""
    return [0] + [k for i in range(1, rows + 1) for k in (-i, i)]


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
    width = 1120
    titles = _title_lines(title, width)
    shift = 22 * (len(titles) - 1)
    height = 640 + shift
    notes = textwrap.wrap(subtitle, 150)
    left, right, top, bottom = 110, 760, 56 + shift + 16 * len(notes), 556 + shift
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
        *(
            _text(width / 2, 28 + 22 * i, line, size=18, anchor="middle", font_weight="bold")
            for i, line in enumerate(titles)
        ),
        *(
            _text(width / 2, 48 + shift + 16 * i, line, size=12, anchor="middle", fill="#444")
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
    ridge_marks = [(x(r.ridge_flops_per_byte), y(r.peak_flops_per_s)) for r in roofs]
    ridge_labels = [f"ridge {r.ridge_flops_per_byte:.3g} FLOP/B" for r in roofs]
    placed = place_labels(
        ridge_marks,
        ridge_labels,
        size=RIDGE_LABEL_SIZE,
        bounds=(left, top, right, bottom),
        mark_radius=RIDGE_MARK_RADIUS + 1,  # the circle's stroke is 2 px wide
    )
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
        rx, ry = ridge_marks[index]
        body.append(
            f'<circle cx="{rx:.1f}" cy="{ry:.1f}" r="{RIDGE_MARK_RADIUS}" fill="white" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        lx, ly, anchor = placed[index]
        box = text_box(lx, ly, ridge_labels[index], size=RIDGE_LABEL_SIZE, anchor=anchor)
        if (lx, ly) != (rx + LABEL_GAP, ry - LABEL_GAP):  # moved away: a leader to its mark
            near_x = box[0] if anchor == "start" else box[2]
            near_y = min(max(ry, box[1]), box[3])
            body.append(
                f'<line x1="{rx:.1f}" y1="{ry:.1f}" x2="{near_x:.1f}" y2="{near_y:.1f}" '
                f'stroke="{colour}" stroke-width="0.8" opacity="0.7"/>'
            )
        body.append(
            _text(lx, ly, ridge_labels[index], size=RIDGE_LABEL_SIZE, anchor=anchor, fill=colour)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ChartFit:
    """The fit verdict a memory chart shows: the same numbers as the estimate's ``fit`` (and the
    CLI's verdict line): the requirement (estimate + context + workspace + safety margin)
    against the device's usable memory."""

    device: str
    required_bytes: int
    usable_bytes: int
    fits: bool
    safety_margin_fraction: float

    @property
    def verdict(self) -> str:
        """``fits nvidia-l4: needs 20.10 GiB of 22.00 GiB usable, headroom 1.90 GiB``."""
        headroom = self.usable_bytes - self.required_bytes
        return (
            f"{'fits' if self.fits else 'does NOT fit'} {self.device}: needs "
            f"{self.required_bytes / GIB:,.2f} GiB of {self.usable_bytes / GIB:,.2f} GiB usable, "
            f"headroom {headroom / GIB:,.2f} GiB"
        )


FITS_COLOUR, SHORT_COLOUR = "#2ca02c", "#d62728"


def breakdown_svg(
    *,
    title: str,
    subtitle: str,
    lines: Sequence[tuple[str, int]],
    total_bytes: int,
    fit: ChartFit | None = None,
) -> str:
    """Horizontal bars, one per breakdown line, and the total, labelled in GiB. With a ``fit``:
    its verdict under the title, a bar for the requirement the fit compares (estimate + context
    + workspace + safety margin), and a dashed line at the usable memory it compares with."""
    shown = [(key, size) for key, size in lines if size > 0]
    width = 900
    titles = _title_lines(title, width)
    shift = 22 * (len(titles) - 1)
    verdict_y = 70 + shift
    left, right, top = 190, 760, 80 + shift + (24 if fit is not None else 0)
    bar, gap = 20, 8
    rows: list[tuple[str, int, str]] = [
        (key, size, PALETTE[index % len(PALETTE)]) for index, (key, size) in enumerate(shown)
    ]
    rows.append(("total (peak)", total_bytes, "#333"))
    if fit is not None:
        margin = f"+{fit.safety_margin_fraction:g} margin"
        rows.append(
            (f"required ({margin})", fit.required_bytes, FITS_COLOUR if fit.fits else SHORT_COLOUR)
        )
    bottom = top + len(rows) * (bar + gap) + 10
    height = bottom + 70
    largest = max(
        [total_bytes, fit.usable_bytes if fit else 0, fit.required_bytes if fit else 0, 1]
    )
    step = _nice_step(largest / GIB)
    limit = math.ceil(largest / GIB / step) * step

    def px(gib: float) -> float:
        return left + gib / limit * (right - left)

    body = [
        *(
            _text(width / 2, 28 + 22 * i, line, size=18, anchor="middle", font_weight="bold")
            for i, line in enumerate(titles)
        ),
        _text(width / 2, 50 + shift, subtitle, size=12, anchor="middle", fill="#444"),
    ]
    if fit is not None:
        colour = FITS_COLOUR if fit.fits else SHORT_COLOUR
        body.append(
            _text(
                width / 2, verdict_y, fit.verdict, size=13, anchor="middle", fill=colour,
                font_weight="bold",
            )
        )  # fmt: skip
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
    for index, (key, size, colour) in enumerate(rows):
        emphasised = index >= len(shown)  # the total and the requirement
        gib = size / GIB
        body.append(
            _text(
                left - 8,
                y + bar * 0.7,
                key,
                anchor="end",
                font_weight="bold" if emphasised else "normal",
            )
        )
        body.append(
            f'<rect x="{left}" y="{y:.1f}" width="{max(px(gib) - left, 1):.1f}" height="{bar}" '
            f'fill="{colour}" fill-opacity="0.8"><title>{escape(key)}: {size:,} B</title></rect>'
        )
        body.append(_text(px(gib) + 6, y + bar * 0.7, f"{gib:.3f} GiB", size=11))
        y += bar + gap
    if fit is not None:
        cx = px(fit.usable_bytes / GIB)
        body.append(
            f'<line x1="{cx:.1f}" y1="{top - 10}" x2="{cx:.1f}" y2="{bottom}" stroke="#d62728" '
            'stroke-width="2" stroke-dasharray="6,4"/>'
        )
        body.append(
            _text(
                cx,
                top - 14,
                f"{fit.device} usable {fit.usable_bytes / GIB:.3g} GiB",
                size=11,
                anchor="middle",
                fill="#d62728",
            )
        )
    return _document(width, height, title, body)
