"""The SVG charts: valid XML, escaped labels, log axes and roofs where they belong."""

import itertools
import math
import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

import pytest

from app.charts import (
    RIDGE_LABEL_SIZE,
    ChartFit,
    ChartInputError,
    Roof,
    RoofPoint,
    boxes_overlap,
    breakdown_svg,
    place_labels,
    roofline_svg,
    text_box,
)
from app.domain.units import GIB

NS = "{http://www.w3.org/2000/svg}"
ROOF = Roof(
    label="GPU <A&B>",
    peak_flops_per_s=1e14,
    bandwidth_bytes_per_s=1e12,
    spec_peak_flops_per_s=2e14,
    spec_bandwidth_bytes_per_s=1.25e12,
)


def test_roofline_is_valid_svg_with_escaped_labels() -> None:
    points = [
        RoofPoint(roof=0, label="conv <1>", intensity_flops_per_byte=10, achieved_flops_per_s=5e12),
        RoofPoint(
            roof=0,
            label="decode",
            intensity_flops_per_byte=1,
            achieved_flops_per_s=5e11,
            decode=True,
        ),
    ]
    svg = roofline_svg(title="T & U", subtitle="s", roofs=[ROOF], points=points)
    root = ET.fromstring(svg)
    texts = ["".join(n.itertext()) for n in root.iter(f"{NS}text")]
    assert "GPU <A&B>" in texts
    assert "ridge 100 FLOP/B" in texts  # 1e14 / 1e12
    assert {"100 TFLOP/s", "1 TFLOP/s", "0.1", "1", "10", "100"} <= set(texts)
    assert len(root.findall(f".//{NS}polygon")) == 1
    tips = [n.text for n in root.iter(f"{NS}title")]
    assert "conv <1>: 10 FLOP/B, 5 TFLOP/s" in tips


def _xy(points: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (pair.split(",") for pair in points.split())]


def test_the_roof_bends_at_the_ridge_point() -> None:
    root = ET.fromstring(roofline_svg(title="t", subtitle="", roofs=[ROOF], points=[]))
    dashed, solid = (_xy(p.attrib["points"]) for p in root.iter(f"{NS}polyline"))
    (start, ridge, end), ridge_mark = solid, root.find(f".//{NS}circle")
    assert ridge_mark is not None
    assert (float(ridge_mark.attrib["cx"]), float(ridge_mark.attrib["cy"])) == pytest.approx(
        ridge, abs=0.1
    )
    assert ridge[1] == pytest.approx(end[1])  # flat after the ridge
    assert start[1] > ridge[1]  # rising (SVG y grows downwards) before it
    # slope 1 on log-log axes: a decade of intensity is a decade of FLOP/s
    lines = list(root.iter(f"{NS}line"))
    verticals = sorted(float(n.attrib["x1"]) for n in lines if n.attrib["x1"] == n.attrib["x2"])
    horizontals = sorted(
        float(n.attrib["y1"])
        for n in lines
        if n.attrib["y1"] == n.attrib["y2"] and float(n.attrib["x1"]) == verticals[0]
    )
    x_decade = verticals[1] - verticals[0]
    y_decade = horizontals[1] - horizontals[0]
    assert (start[1] - ridge[1]) / y_decade == pytest.approx((ridge[0] - start[0]) / x_decade)
    assert dashed[-1][1] < end[1]  # the catalog peak is above the calibrated one


def test_breakdown_bars_in_gib() -> None:
    svg = breakdown_svg(
        title="m",
        subtitle="s",
        lines=[("weights", 2 * GIB), ("a<b", GIB // 2), ("empty", 0)],
        total_bytes=3 * GIB,
    )
    root = ET.fromstring(svg)
    texts = ["".join(n.itertext()) for n in root.iter(f"{NS}text")]
    assert {"weights", "a<b", "total (peak)", "2.000 GiB", "0.500 GiB", "3.000 GiB"} <= set(texts)
    assert "empty" not in texts
    assert not any("usable" in t or "fit" in t for t in texts)  # no device: no verdict
    widths = [float(r.attrib["width"]) for r in root.iter(f"{NS}rect")][1:]
    assert widths[0] == pytest.approx(4 * widths[1], abs=0.5)  # 2 GiB vs 0.5 GiB
    assert widths[2] == pytest.approx(1.5 * widths[0], abs=0.2)  # the 3 GiB total


@pytest.mark.parametrize("fits", [True, False])
def test_breakdown_shows_the_fit_verdict_the_requirement_and_the_usable_line(fits: bool) -> None:
    """A peak under the device's memory can still not fit: the chart shows the requirement
    (with context, workspace and margin) and the usable line the fit compared, and says so."""
    required = int(24.92 * GIB) if not fits else int(20.5 * GIB)
    fit = ChartFit(
        device="nvidia-l4", required_bytes=required, usable_bytes=24 * GIB, fits=fits,
        safety_margin_fraction=0.05,
    )  # fmt: skip
    svg = breakdown_svg(
        title="m", subtitle="s", lines=[("weights", 20 * GIB)], total_bytes=int(23.73 * GIB),
        fit=fit,
    )  # fmt: skip
    root = ET.fromstring(svg)
    texts = ["".join(n.itertext()) for n in root.iter(f"{NS}text")]
    verdict = "fits" if fits else "does NOT fit"
    headroom = (24 * GIB - required) / GIB
    assert (
        f"{verdict} nvidia-l4: needs {required / GIB:,.2f} GiB of 24.00 GiB usable, "
        f"headroom {headroom:,.2f} GiB"
    ) in texts
    assert "required (+0.05 margin)" in texts
    assert f"{required / GIB:.3f} GiB" in texts
    assert "nvidia-l4 usable 24 GiB" in texts
    bars = {r.findtext(f"{NS}title", "").split(":")[0]: r for r in root.iter(f"{NS}rect")}
    colour = bars["required (+0.05 margin)"].attrib["fill"]
    assert colour == ("#2ca02c" if fits else "#d62728")
    line = next(n for n in root.iter(f"{NS}line") if n.attrib.get("stroke-dasharray") == "6,4")
    end = float(bars["required (+0.05 margin)"].attrib["x"]) + float(
        bars["required (+0.05 margin)"].attrib["width"]
    )
    assert (end > float(line.attrib["x1"])) is not fits  # the bar crosses the line iff short
    assert_no_overlap(svg)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("peak_flops_per_s", 5e-324),
        ("peak_flops_per_s", 0.0),
        ("bandwidth_bytes_per_s", 1e-308),
        ("spec_peak_flops_per_s", float("inf")),
        ("spec_bandwidth_bytes_per_s", float("nan")),
        ("bandwidth_bytes_per_s", -1.0),
    ],
)
def test_a_roof_that_a_log_axis_cannot_draw_is_refused(field: str, value: float) -> None:
    changes: dict[str, Any] = {field: value}
    with pytest.raises(ChartInputError) as raised:
        replace(ROOF, **changes)
    assert str(raised.value) == (
        f"roof 'GPU <A&B>': {field} must be a positive, finite number of at least "
        f"2.22507e-308, got {value!r}"
    )


def test_a_roof_whose_ridge_underflows_is_refused() -> None:
    with pytest.raises(ChartInputError, match="the ridge point is out of range"):
        replace(ROOF, peak_flops_per_s=1e-300, bandwidth_bytes_per_s=1e300)


def test_points_off_the_log_axes_are_left_out() -> None:
    points = [
        RoofPoint(roof=0, label="ok", intensity_flops_per_byte=10, achieved_flops_per_s=5e12),
        RoofPoint(
            roof=0, label="no dram", intensity_flops_per_byte=math.inf, achieved_flops_per_s=1e12
        ),
        RoofPoint(roof=0, label="idle", intensity_flops_per_byte=1, achieved_flops_per_s=0.0),
        RoofPoint(roof=0, label="tiny", intensity_flops_per_byte=5e-324, achieved_flops_per_s=1e9),
    ]
    root = ET.fromstring(roofline_svg(title="t", subtitle="", roofs=[ROOF], points=points))
    tips = [n.text or "" for n in root.iter(f"{NS}title")]
    assert [tip.split(":")[0] for tip in tips[1:]] == ["ok"]
    assert "inf" not in roofline_svg(title="t", subtitle="", roofs=[ROOF], points=points)


def _ridge_boxes(root: ET.Element) -> list[tuple[float, float, float, float]]:
    boxes = []
    for node in root.iter(f"{NS}text"):
        content = "".join(node.itertext())
        if content.startswith("ridge "):
            assert node.attrib["font-size"] == str(RIDGE_LABEL_SIZE)
            boxes.append(
                text_box(
                    float(node.attrib["x"]),
                    float(node.attrib["y"]),
                    content,
                    size=RIDGE_LABEL_SIZE,
                    anchor=node.attrib["text-anchor"],
                )
            )
    return boxes


def _roof(label: str, peak: float, bandwidth: float) -> Roof:
    return Roof(
        label=label,
        peak_flops_per_s=peak,
        bandwidth_bytes_per_s=bandwidth,
        spec_peak_flops_per_s=peak * 1.4,
        spec_bandwidth_bytes_per_s=bandwidth * 1.2,
    )


# Eight devices with ridge points close together (similar GPUs; the same GPU twice), which drew
# their labels on top of each other.
CROWDED = [
    _roof("a", 1.0e14, 1.0e12),
    _roof("b", 1.1e14, 1.0e12),
    _roof("c", 1.0e14, 1.0e12),
    _roof("d", 0.9e14, 0.95e12),
    _roof("e", 1.2e14, 1.3e12),
    _roof("f", 1.0e14, 0.8e12),
    _roof("g", 3.0e13, 3.0e11),
    _roof("h", 3.1e13, 3.0e11),
]


def test_the_text_box_estimate() -> None:
    assert text_box(10, 100, "abcd", size=10) == pytest.approx((10, 92, 10 + 24.8, 102.5))
    assert text_box(10, 100, "abcd", size=10, anchor="end")[2] == 10
    assert boxes_overlap((0, 0, 10, 10), (9, 9, 20, 20))
    assert not boxes_overlap((0, 0, 10, 10), (10, 0, 20, 10))  # touching is not overlapping


@pytest.mark.parametrize("count", [2, 3, 5, 8])
def test_ridge_labels_never_overlap(count: int) -> None:
    root = ET.fromstring(roofline_svg(title="t", subtitle="", roofs=CROWDED[:count], points=[]))
    boxes = _ridge_boxes(root)
    assert len(boxes) == count
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not boxes_overlap(a, b), (a, b)
    plot = root.find(f".//{NS}clipPath/{NS}rect")
    assert plot is not None
    left, top = float(plot.attrib["x"]), float(plot.attrib["y"])
    right, bottom = left + float(plot.attrib["width"]), top + float(plot.attrib["height"])
    for box in boxes:  # inside the (clipped) plot: drawn in full
        assert left <= box[0]
        assert box[2] <= right
        assert top <= box[1]
        assert box[3] <= bottom


def test_a_label_that_had_to_move_is_tied_to_its_mark() -> None:
    root = ET.fromstring(roofline_svg(title="t", subtitle="", roofs=CROWDED[:3], points=[]))
    marks = [(float(c.attrib["cx"]), float(c.attrib["cy"])) for c in root.iter(f"{NS}circle")]
    leaders = [
        n for n in root.iter(f"{NS}line") if n.attrib.get("stroke-width") == "0.8"
    ]  # a and c share their ridge point: c's label moved
    assert leaders
    for line in leaders:
        start = (float(line.attrib["x1"]), float(line.attrib["y1"]))
        assert start in [(round(x, 1), round(y, 1)) for x, y in marks]


def test_labels_are_placed_deterministically_near_their_marks() -> None:
    marks = [(100.0, 100.0)] * 4
    labels = ["ridge 100 FLOP/B"] * 4
    first = place_labels(marks, labels, size=11, bounds=(0, 0, 400, 400))
    assert first == place_labels(marks, labels, size=11, bounds=(0, 0, 400, 400))
    assert first[0] == (107, 93, "start")  # the free spot: up and right of the mark
    assert all(abs(y - 100) < 60 for _, y, _ in first)
    boxes = [
        text_box(x, y, text, size=11, anchor=a)
        for (x, y, a), text in zip(first, labels, strict=True)
    ]
    assert not any(boxes_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_long_titles_wrap_and_push_the_plot_down() -> None:
    title = "Roofline: " + ", ".join(f"binding{i} {i * 100}" for i in range(12))
    root = ET.fromstring(roofline_svg(title=title, subtitle="", roofs=[ROOF], points=[]))
    lines = [n.text or "" for n in root.iter(f"{NS}text") if n.attrib["font-size"] == "18"]
    assert len(lines) == 2
    assert " ".join(lines) == title
    assert root.findtext(f"{NS}title") == title
    plot = root.find(f".//{NS}clipPath/{NS}rect")
    assert plot is not None
    assert float(plot.attrib["y"]) == 56 + 22 + 16 * 0


def text_boxes(svg: bytes | str) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Every unrotated ``<text>`` of ``svg`` with the box it covers (app.charts.text_box)."""
    root = ET.fromstring(svg)
    found = []
    for node in root.iter(f"{NS}text"):
        if "transform" in node.attrib:  # the rotated y-axis title, alone at the left edge
            continue
        content = "".join(node.itertext())
        box = text_box(
            float(node.attrib["x"]),
            float(node.attrib["y"]),
            content,
            size=int(node.attrib["font-size"]),
            anchor=node.attrib.get("text-anchor", "start"),
        )
        found.append((content, box))
    return found


def assert_no_overlap(svg: bytes | str) -> None:
    """No two texts of ``svg`` share area, none covers a ridge mark, all lie inside it."""
    root = ET.fromstring(svg)
    width, height = float(root.attrib["width"]), float(root.attrib["height"])
    boxes = text_boxes(svg)
    overlapping = [
        (a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
        if boxes_overlap(box_a, box_b)
    ]  # fmt: skip
    assert not overlapping, overlapping[:5]
    marks = [
        (float(c.attrib["cx"]), float(c.attrib["cy"]), float(c.attrib["r"]) + 1)
        for c in root.iter(f"{NS}circle")
        if c.attrib.get("fill") == "white"  # the ridge marks (kernels are filled dots)
    ]
    covered = [
        (text, (x, y)) for text, box in boxes for x, y, r in marks
        if boxes_overlap(box, (x - r, y - r, x + r, y + r))
    ]  # fmt: skip
    assert not covered, covered[:5]
    outside = [t for t, (x0, y0, x1, y1) in boxes if x0 < 0 or y0 < 0 or x1 > width or y1 > height]
    assert not outside, outside


@pytest.mark.parametrize("count", [4, 5, 6, 8])
def test_no_label_overlaps_another_or_a_mark_with_many_devices(count: int) -> None:
    """Ridge points close together (CROWDED): each label avoids the other labels and every
    device's ridge mark, and the legend's rows do not collide."""
    points = [
        RoofPoint(roof=i % count, label=f"k{i}", intensity_flops_per_byte=10.0 ** (i % 4),
                  achieved_flops_per_s=1e12 * (1 + i))
        for i in range(24)
    ]  # fmt: skip
    long_labels = [replace(roof, label=f"NVIDIA device {roof.label} with a long name, bf16")
                   for roof in CROWDED[:count]]  # fmt: skip
    assert_no_overlap(roofline_svg(title="t", subtitle="", roofs=long_labels, points=points))
