"""Chart labels never overlap (each other, or a ridge mark) on charts the API draws."""

import pytest

from tests.support import ApiClient
from tests.test_charts import assert_no_overlap

DEVICES = [
    "nvidia-h100-sxm",
    "nvidia-a100-80gb-sxm",
    "nvidia-a100-80gb-sxm/1g.10gb",
    "nvidia-l4",
    "nvidia-h200-sxm",
    "nvidia-a10",
    "nvidia-l40s",
    "intel-xeon-platinum-8480plus",
]


@pytest.mark.parametrize("count", [1, 2, 4, 6, 8])
def test_roofline_labels_never_overlap(client: ApiClient, count: int) -> None:
    response = client.get(
        "/v1/recommendations/roofline.svg",
        params={
            "model": "gpt-2",
            "devices": ",".join(DEVICES[:count]),
            "precision": "int8",
            "prompt_tokens": 64,
            "generated_tokens": 16,
            "batch_size": 4,
        },
    )
    assert response.status_code == 200, response.text
    assert_no_overlap(response.content)
