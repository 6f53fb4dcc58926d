"""The rotary cos/sin cache as vLLM 0.19's get_rope reads a config.json
(vllm/model_executor/layers/rotary_embedding/__init__.py, base.py, yarn_scaling_rope.py):
max_position_embeddings x int(head_dim x partial_rotary_factor) rows x columns, YaRN's
original_max_position_embeddings x factor rows; in the model dtype, one per GPU."""

from __future__ import annotations

import json
from typing import Any

from app.config import PROJECT_ROOT
from app.domain.engines.vllm import rotary_cache_bytes
from app.services.engines import hf_serving_model

CONFIG: dict[str, Any] = json.loads(
    (PROJECT_ROOT / "tests/fixtures/hf_configs/llama-3-8b.json").read_text()
)


def test_the_default_rope_is_context_x_head_dim() -> None:
    _, model, _ = hf_serving_model(CONFIG)
    assert (model.max_position_embeddings, model.head_dim) == (8192, 128)
    assert rotary_cache_bytes(model, 2) == 8192 * 128 * 2


def test_yarn_rows_and_a_partial_rotary_factor() -> None:
    yarn = {**CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 8192}}  # fmt: skip
    _, model, _ = hf_serving_model(yarn)
    assert model.rotary_positions == 32_768
    assert rotary_cache_bytes(model, 2) == 32_768 * 128 * 2
    _, partial, _ = hf_serving_model({**CONFIG, "partial_rotary_factor": 0.5})
    assert partial.rotary_dim == 64
    assert rotary_cache_bytes(partial, 2) == 8192 * 64 * 2
    # llama3 scaling keeps max_position_embeddings rows (Llama3RotaryEmbedding)
    llama3 = {**CONFIG, "max_position_embeddings": 131_072,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}  # fmt: skip
    _, model31, _ = hf_serving_model(llama3)
    assert rotary_cache_bytes(model31, 2) == 131_072 * 128 * 2
