from fractions import Fraction

import pytest

from app.domain.precision import DType, Precision, bytes_per_element, scale_bytes, tensor_bytes


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (DType.FP64, Fraction(8)),
        (DType.FP32, Fraction(4)),
        (DType.TF32, Fraction(4)),
        (DType.BF16, Fraction(2)),
        (DType.FP16, Fraction(2)),
        (DType.FP8, Fraction(1)),
        (DType.INT8, Fraction(1)),
        (DType.INT4, Fraction(1, 2)),
        (DType.FP4, Fraction(1, 2)),
    ],
)
def test_bytes_per_element(dtype: DType, expected: Fraction) -> None:
    assert bytes_per_element(dtype) == expected


def test_vgg16_weights_fp32_golden() -> None:
    # DESIGN.md: 138,357,544 params x 4 B = 553,430,176 B (the seed's "540 MB").
    assert tensor_bytes(138_357_544, DType.FP32) == 553_430_176


def test_vgg16_first_feature_map_batch_32_golden() -> None:
    # DESIGN.md: 224 * 224 * 64 * 32 * 4 = 411,041,792 B (the seed's "401.40 MB").
    assert tensor_bytes(224 * 224 * 64 * 32, DType.FP32) == 411_041_792


def test_int4_rounds_up_to_whole_bytes() -> None:
    assert tensor_bytes(3, DType.INT4) == 2
    assert tensor_bytes(4, DType.INT4) == 2


def test_negative_element_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="num_elements"):
        tensor_bytes(-1, DType.FP32)


def test_nvfp4_scales_golden() -> None:
    # one fp8 scale per 16 elements (rounded up) + one fp32 scale per tensor
    assert scale_bytes(Precision.FP4, (4096, 4096)) == 4096 * 4096 // 16 + 4
    assert scale_bytes(Precision.FP4, (10, 3)) == 2 + 4
