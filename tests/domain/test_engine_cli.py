"""vLLM's command line as a pod runs it (app.domain.engines.cli): flags read with vLLM's names,
unknown flags ignored and listed, refused values naming the flag."""

from __future__ import annotations

import pytest

from app.domain.engines.cli import EngineArgsError, engine_args, engine_command


def test_vllm_serve_with_its_flags() -> None:
    found = engine_command(
        ["vllm", "serve", "meta-llama/Meta-Llama-3-8B", "--max-model-len", "4096",
         "-tp", "2", "--gpu-memory-utilization=0.85", "--max-num-seqs", "64",
         "--max-num-batched-tokens", "4096", "--kv-cache-dtype", "fp8", "--dtype", "bfloat16",
         "--block-size", "32", "--enforce-eager", "-pp", "1", "--port", "8000",
         "--trust-remote-code"]
    )  # fmt: skip
    assert found is not None
    assert found.model == "meta-llama/Meta-Llama-3-8B"
    assert found.options == {
        "max_model_len": 4096,
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.85,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 4096,
        "kv_cache_dtype": "fp8",
        "dtype": "bfloat16",
        "block_size": 32,
        "enforce_eager": True,
        "pipeline_parallel_size": 1,
    }
    assert found.flags["tensor_parallel_size"] == "-tp"
    assert found.ignored == ("--port", "--trust-remote-code")


def test_the_api_server_module_underscores_and_human_lengths() -> None:
    found = engine_command(
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/llama-3-8b",
         "--max_model_len", "8k", "--tensor_parallel_size=4", "--max-num-batched-tokens", "2K",
         "--no-enforce-eager"]
    )  # fmt: skip
    assert found is not None
    assert found.model == "/models/llama-3-8b"
    # vLLM's human_readable_int: lower case powers of 1000, upper case powers of 1024
    assert found.options["max_model_len"] == 8000
    assert found.options["max_num_batched_tokens"] == 2048
    assert found.options["tensor_parallel_size"] == 4
    assert found.options["enforce_eager"] is False


def test_a_shell_script_is_split_once_up_to_its_next_command() -> None:
    found = engine_command(
        ["/bin/sh", "-c", "pip list && exec vllm serve llama-3-8b -tp 2 && echo done"]
    )
    assert found is not None
    assert (found.model, found.options) == ("llama-3-8b", {"tensor_parallel_size": 2})


def test_other_commands_are_no_engine() -> None:
    assert engine_command(["python", "serve.py", "--model", "x"]) is None
    assert engine_command(["vllm", "bench", "serve"]) is None
    assert engine_command([]) is None


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        ("--tensor-parallel-size two", "--tensor-parallel-size"),
        ("-tp", "-tp"),
        ("--gpu-memory-utilization high", "--gpu-memory-utilization"),
        ("--max-model-len 1.5", "--max-model-len"),
        ("--dtype int3", "--dtype"),
        ("--kv-cache-dtype fp4", "--kv-cache-dtype"),
        ("--enforce-eager=maybe", "--enforce-eager"),
        ("--max-num-seqs -4", "--max-num-seqs"),
    ],
)
def test_a_value_vllm_refuses_names_its_flag(args: str, flag: str) -> None:
    with pytest.raises(EngineArgsError) as caught:
        engine_args(args)
    assert caught.value.flag == flag
    assert flag in str(caught.value)


def test_annotation_args_take_the_model_given() -> None:
    found = engine_args("--max-model-len 2048 --served-model-name chat", model="llama-3-8b")
    assert found.model == "llama-3-8b"
    assert found.options == {"max_model_len": 2048}
    assert found.ignored == ("--served-model-name",)


def test_the_positional_model_may_follow_known_flags() -> None:
    found = engine_command(["vllm", "serve", "-tp", "2", "llama-3-8b", "--max-model-len=1024"])
    assert found is not None
    assert found.model == "llama-3-8b"
    assert found.options == {"tensor_parallel_size": 2, "max_model_len": 1024}
