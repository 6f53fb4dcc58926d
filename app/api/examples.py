"""Request examples of the OpenAPI document: each one is a complete, valid request.

Swagger UI's "Try it out" and ReDoc show these instead of a body assembled from every field's
own example (which held both `model` and `architecture` and so was a 422). They name the
seeded catalog (`nvidia-a100-80gb-sxm`) and model zoo (`llama-2-7b`), or what an earlier
example creates: `POST /v1/models` creates `tiny-cnn`, `POST /v1/hardware` creates
`lab-gpu-1` and `POST /v1/workloads` creates `chat-serving`, the resources that the PUT and
DELETE examples (and the stored-workload examples) name. tests/api/test_openapi_examples.py
sends every one of them, in that order, to the app on a fresh database and expects a 2xx.
"""

from __future__ import annotations

from typing import Any

# Names the examples share (the seeded catalog and zoo, and what the create examples make).
CATALOG_GPU = "nvidia-a100-80gb-sxm"
CATALOG_MIG_GPU_40GB = "nvidia-a100-40gb-sxm"
ZOO_MODEL = "llama-2-7b"
USER_MODEL = "tiny-cnn"
USER_HARDWARE = "lab-gpu-1"
USER_WORKLOAD = "chat-serving"


def example(summary: str, value: dict[str, Any], description: str | None = None) -> Any:
    """An OpenAPI Example Object."""
    item: dict[str, Any] = {"summary": summary, "value": value}
    if description:
        item["description"] = description
    return item


_TINY_CNN_BODY: dict[str, Any] = {
    "name": "Tiny CNN",
    "family": "cnn",
    "description": "A 10-class image classifier.",
    "inputs": [{"name": "image", "shape": ["batch", 3, "image", "image"]}],
    "layers": [
        {"name": "conv1", "op": "conv2d", "out_channels": 64, "kernel_size": 3, "padding": 1},
        {"name": "relu1", "op": "relu", "inplace": True},
        {"name": "pool", "op": "adaptive_avgpool2d", "output_size": 1},
        {"name": "flatten", "op": "flatten", "start_dim": 1},
        {"name": "fc", "op": "linear", "out_features": 10},
    ],
    "default_bindings": {"image": 32},
}

_MLP_ARCHITECTURE: dict[str, Any] = {
    "inputs": [{"name": "x", "shape": ["batch", 784]}],
    "layers": [
        {"name": "fc1", "op": "linear", "out_features": 4096},
        {"name": "act", "op": "gelu"},
        {"name": "fc2", "op": "linear", "out_features": 10},
    ],
}

MODEL_CREATE = {
    "tiny-cnn": example(
        "A small CNN given layer by layer",
        {"slug": USER_MODEL, **_TINY_CNN_BODY},
        "Creates `tiny-cnn` (the model the PUT and DELETE examples name).",
    )
}
MODEL_REPLACE = {
    "wider-head": example(
        "Replace the layers of tiny-cnn",
        {
            **_TINY_CNN_BODY,
            "description": "A 100-class image classifier.",
            "layers": [
                *_TINY_CNN_BODY["layers"][:-1],
                {"name": "fc", "op": "linear", "out_features": 100},
            ],
        },
    )
}

_LAB_GPU_BODY: dict[str, Any] = {
    "vendor": "Acme",
    "name": "Acme Lab GPU",
    "kind": "gpu",
    "family": "acme-lab",
    "launch_year": 2024,
    "memory_bytes": 25_769_803_776,
    "memory_type": "GDDR6",
    "memory_bandwidth_bytes_per_s": 900_000_000_000,
    "peak_flops_per_s": {"fp32": 15.7e12, "fp16": 125e12, "bf16": 125e12},
    "host_link": {"type": "PCIe Gen4 x16", "pcie_generation": 4, "pcie_lanes": 16},
    "tdp_watts": 300,
    "price_usd_per_hour": 1.5,
    "price_kind": "on_demand",
    "price_region": "on-premises",
    "price_source": "internal chargeback rate",
    "sources": ["lab measurement"],
}

HARDWARE_CREATE = {
    "lab-gpu": example(
        "A GPU of your own",
        {"slug": USER_HARDWARE, **_LAB_GPU_BODY},
        "Creates `lab-gpu-1` (the profile the PUT and DELETE examples name).",
    )
}
HARDWARE_REPLACE = {
    "new-price": example(
        "Replace lab-gpu-1 with a new price", {**_LAB_GPU_BODY, "price_usd_per_hour": 1.2}
    )
}

_CHAT_SERVING_BODY: dict[str, Any] = {
    "name": "Chat serving",
    "description": "Llama 3 8B answering chats, 4 at a time.",
    "model": "llama-3-8b",
    "mode": "inference",
    "batch_size": 4,
    "sequence_length": 4096,
    "precision": "bf16",
    "hardware": CATALOG_GPU,
}

WORKLOAD_CREATE = {
    "chat-serving": example(
        "Llama 3 8B serving, batch 4 at 4096 tokens",
        {"slug": USER_WORKLOAD, **_CHAT_SERVING_BODY},
        "Creates `chat-serving` (the workload the admission, MIG, PUT and DELETE examples name).",
    )
}
WORKLOAD_REPLACE = {
    "shorter-context": example(
        "Serve chat-serving at 2048 tokens", {**_CHAT_SERVING_BODY, "sequence_length": 2048}
    )
}

MEMORY_ESTIMATE = {
    "stored-model": example(
        "A zoo model served on a catalog GPU",
        {
            "model": ZOO_MODEL,
            "mode": "inference",
            "batch_size": 1,
            "sequence_length": 4096,
            "precision": "bf16",
            "hardware": CATALOG_GPU,
        },
    ),
    "inline-training": example(
        "Training an inline architecture",
        {
            "architecture": _MLP_ARCHITECTURE,
            "mode": "training",
            "batch_size": 256,
            "precision": "amp_bf16",
            "optimizer": "adamw",
        },
    ),
}

_INLINE_WORKLOAD: dict[str, Any] = {
    "model": ZOO_MODEL,
    "mode": "inference",
    "batch_size": 1,
    "sequence_length": 2048,
    "precision": "bf16",
}

MIG_FIT = {
    "inline-workload": example(
        "Which MIG slices host Llama 2 7B?",
        {"workload": _INLINE_WORKLOAD, "gpu": CATALOG_GPU},
    ),
    "stored-workload": example(
        "Does the stored workload fit a 3g.40gb slice?",
        {"workload": USER_WORKLOAD, "gpu": CATALOG_GPU, "profile": "3g.40gb"},
    ),
}

MIG_LAYOUT = {
    "valid": example(
        "3g.20gb + 2g.10gb + 1g.5gb on an A100 40GB",
        {
            "gpu": CATALOG_MIG_GPU_40GB,
            "instances": [
                {"profile": "3g.20gb", "start": 4},
                {"profile": "2g.10gb", "start": 0},
                {"profile": "1g.5gb", "start": 2},
            ],
        },
    )
}

MIG_PLAN = {
    "mixed": example(
        "Two sized workloads and a fixed profile",
        {
            "gpu": CATALOG_GPU,
            "workloads": [
                {"name": "chat", "replicas": 2, "workload": USER_WORKLOAD},
                {"name": "llama-batch-1", "replicas": 1, "workload": _INLINE_WORKLOAD},
                {"name": "notebooks", "replicas": 3, "profile": "1g.10gb"},
            ],
            "config_name": "capacity-planner",
        },
    )
}

ADMISSION_CHECK = {
    "stored-workload": example(
        "May chat-serving run on a 3g.40gb slice?",
        {"workload": USER_WORKLOAD, "resource": "nvidia.com/mig-3g.40gb", "gpu_model": CATALOG_GPU},
    ),
    "inline-workload": example(
        "May Llama 2 7B run on a 2g.20gb slice?",
        {
            "workload": _INLINE_WORKLOAD,
            "resource": "nvidia.com/mig-2g.20gb",
            "gpu_model": CATALOG_GPU,
        },
    ),
}

RECOMMENDATION = {
    "stored-model": example(
        "ResNet-50: CPU or GPU at 20 ms?",
        {
            "model": "resnet-50",
            "batch_sizes": [1, 8, 32],
            "precisions": ["fp16", "int8"],
            "latency_slo_ms": 20.0,
            "devices": [
                "intel-xeon-platinum-8480plus",
                "nvidia-a10",
                "nvidia-a100-80gb-sxm/1g.10gb",
            ],
            "objective": "cost",
        },
    ),
    "inline-architecture": example(
        "An inline MLP, every stored device",
        {"architecture": _MLP_ARCHITECTURE, "batch_sizes": [1, 64], "limit": 5},
    ),
}

HF_CONFIG_IMPORT = {
    "llama": example(
        "A Llama 3 8B config.json",
        {
            "slug": "my-llama-3-8b",
            "name": "My Llama 3 8B",
            "family": "transformer-decoder",
            "sequence_length": 4096,
            "config": {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_attention_heads": 32,
                "num_hidden_layers": 32,
                "num_key_value_heads": 8,
                "max_position_embeddings": 8192,
                "vocab_size": 128256,
                "tie_word_embeddings": False,
            },
        },
    )
}

VLLM_MEMORY = {
    "defaults": example(
        "Llama-3-8B on one H100 with vLLM's defaults",
        {"model": "llama-3-8b", "hardware": "nvidia-h100-sxm"},
    ),
    "tensor-parallel": example(
        "Tensor parallel 2, fp8 KV cache, 4096-token sequences",
        {
            "model": "llama-3-8b",
            "hardware": "nvidia-h100-sxm",
            "tensor_parallel_size": 2,
            "kv_cache_dtype": "fp8",
            "max_model_len": 4096,
            "gpu_memory_utilization": 0.95,
        },
    ),
    "runtime-fp8": example(
        "vLLM --quantization fp8: a 16-bit checkpoint quantized at load time",
        {"model": "llama-3-8b", "hardware": "nvidia-h100-sxm", "quantization": "fp8"},
    ),
    "gptq-checkpoint": example(
        "A GPTQ W4A16 checkpoint (its quantization_config): runs as gptq_marlin",
        {
            "model": "llama-3-8b",
            "hardware": "nvidia-h100-sxm",
            "dtype": "float16",
            "quantization_config": {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": 128,
                "desc_act": True,
                "sym": True,
            },
        },
    ),
}
