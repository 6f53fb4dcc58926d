"""A serving engine's command line as a pod runs it: ``vllm serve <model> [--flags]`` or
``python -m vllm.entrypoints.openai.api_server --model <model> [--flags]``, parsed with vLLM's
option names (pure, bounded: admission reads it from a pod's container command and args).

vLLM's parser (``vllm/utils/argparse_utils.py`` ``FlexibleArgumentParser``, 0.19) accepts
``--flag value`` and ``--flag=value``, and underscores for dashes in long options
(``--max_model_len``); ``-tp``/``-pp``/``-q`` are its short forms. The flags the start-up memory
depends on are read; every other flag is ignored and listed. A value vLLM would refuse is an
:class:`EngineArgsError` naming the flag.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.domain.errors import DomainError

MAX_TOKENS = 1024  # tokens of one command line examined
MAX_TOKEN_CHARS = 8192  # a longer token (a shell script) is not parsed
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# flag -> (vLLM option name, kind)
FLAGS: dict[str, tuple[str, str]] = {
    "--tensor-parallel-size": ("tensor_parallel_size", "int"),
    "-tp": ("tensor_parallel_size", "int"),
    "--pipeline-parallel-size": ("pipeline_parallel_size", "int"),
    "-pp": ("pipeline_parallel_size", "int"),
    "--max-model-len": ("max_model_len", "human_int"),
    "--gpu-memory-utilization": ("gpu_memory_utilization", "float"),
    "--max-num-seqs": ("max_num_seqs", "int"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", "human_int"),
    "--kv-cache-dtype": ("kv_cache_dtype", "str"),
    "--dtype": ("dtype", "str"),
    "--block-size": ("block_size", "int"),
    "--enforce-eager": ("enforce_eager", "flag"),
    "--no-enforce-eager": ("enforce_eager", "no_flag"),
    "--quantization": ("quantization", "str"),
    "-q": ("quantization", "str"),
    "--model": ("model", "str"),
}
# vLLM's choices (vllm/config/model.py ModelDType, vllm/config/cache.py CacheDType, 0.19)
DTYPES = frozenset({"auto", "half", "float16", "bfloat16", "float", "float32"})
KV_CACHE_DTYPES = frozenset({"auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"})

# vllm/utils/argparse_utils.py human_readable_int: "25.6k" = 25,600 (lower case: powers of
# 1000), "1K" = 1,024 (upper case: powers of 1024)
_HUMAN = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT]?)$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class EngineArgsError(DomainError):
    """A flag whose value the engine would refuse; ``flag`` names it as written."""

    def __init__(self, message: str, *, flag: str) -> None:
        super().__init__(message)
        self.flag = flag


@dataclass(frozen=True, slots=True)
class EngineCommand:
    """An engine's command line: the model as served (positional or ``--model``), the options
    read (vLLM's names), the flag each came from, and the flags ignored."""

    engine: str
    model: str | None
    options: dict[str, int | float | str | bool] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)  # option -> flag as written
    ignored: tuple[str, ...] = ()


def _value(flag: str, kind: str, text: str) -> int | float | str | bool:
    if kind in ("int", "human_int"):
        match = _HUMAN.match(text) if kind == "human_int" else None
        if match is not None and match.group(2):
            number, unit = match.groups()
            scale = _DECIMAL.get(unit) or _BINARY[unit]
            value = float(number) * scale
            if value != int(value):
                raise EngineArgsError(f"{flag} {text!r} is not a whole number", flag=flag)
            result = int(value)
        elif text.isascii() and text.isdigit() and len(text) <= 12:
            result = int(text)
        else:
            raise EngineArgsError(f"{flag} {text[:40]!r} is not an integer", flag=flag)
        return result
    if kind == "float":
        try:
            number = float(text)
        except ValueError:
            raise EngineArgsError(f"{flag} {text[:40]!r} is not a number", flag=flag) from None
        return number
    if kind in ("flag", "no_flag"):
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise EngineArgsError(f"{flag} takes no value, got {text[:40]!r}", flag=flag)
        return (lowered == "true") == (kind == "flag")
    return text


def parse_vllm_args(tokens: Sequence[str], *, model: str | None = None) -> EngineCommand:
    """vLLM's options from the tokens after ``vllm serve`` (a leading positional is the model)
    or after the API server module. Raises :class:`EngineArgsError` for a value vLLM refuses
    to parse (a missing value, a non-integer degree, an unknown dtype)."""
    if len(tokens) > MAX_TOKENS:
        raise EngineArgsError(f"{len(tokens)} arguments; at most {MAX_TOKENS} are read", flag="")
    options: dict[str, int | float | str | bool] = {}
    flags: dict[str, str] = {}
    ignored: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token.startswith("-"):
            if model is None:
                model = token  # vllm serve's positional model_tag (argparse: anywhere)
            continue
        name, eq, inline = token.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        known = FLAGS.get(name)
        if known is None:
            ignored.append(name)
            if not eq and index < len(tokens) and not tokens[index].startswith("-"):
                index += 1  # its value (an unknown flag's value is taken to follow it)
            continue
        option, kind = known
        if kind in ("flag", "no_flag"):
            value: int | float | str | bool = _value(name, kind, inline) if eq else kind == "flag"
        else:
            if eq:
                text = inline
            elif index < len(tokens):
                text = tokens[index]
                index += 1
            else:
                raise EngineArgsError(f"{name} expects a value", flag=name)
            value = _value(name, kind, text)
        if option == "model":
            model = str(value)
            continue
        options[option] = value
        flags[option] = name
    for option, allowed in (("dtype", DTYPES), ("kv_cache_dtype", KV_CACHE_DTYPES)):
        if option in options and options[option] not in allowed:
            raise EngineArgsError(
                f"{flags[option]} {str(options[option])[:40]!r} is not one of {sorted(allowed)}",
                flag=flags[option],
            )
    return EngineCommand(
        engine="vllm", model=model, options=options, flags=flags, ignored=tuple(ignored)
    )


_SEPARATORS = frozenset({"&&", ";", "||", "|", "&"})


def _engine_tail(argv: Sequence[str], *, depth: int = 0) -> list[str] | None:
    """The tokens after ``vllm serve`` or the API server module, None when ``argv`` runs
    neither (a shell's ``-c`` script is split once and searched too, up to its next command
    separator)."""
    for index, token in enumerate(argv):
        base = token.rsplit("/", 1)[-1]
        if base == "vllm" and index + 1 < len(argv) and argv[index + 1] == "serve":
            return list(argv[index + 2 :])
        if token == API_SERVER_MODULE and index > 0 and argv[index - 1] == "-m":
            return list(argv[index + 1 :])
    if depth > 0:
        return None
    for token in argv:
        if " " in token and "vllm" in token and len(token) <= MAX_TOKEN_CHARS:
            try:
                inner = shlex.split(token)
            except ValueError:
                continue
            tail = _engine_tail(inner, depth=1)
            if tail is not None:
                cut = next((i for i, part in enumerate(tail) if part in _SEPARATORS), len(tail))
                return tail[:cut]
    return None


def engine_command(argv: Sequence[str]) -> EngineCommand | None:
    """The engine a container's command + args runs (None: no engine recognised)."""
    if len(argv) > MAX_TOKENS:
        return None
    tail = _engine_tail([str(token) for token in argv])
    if tail is None:
        return None
    return parse_vllm_args(tail)


def engine_args(text: str, *, model: str | None = None) -> EngineCommand:
    """An engine's flags from an annotation (``--max-model-len 8192 -tp 2``), for launchers
    whose command line the webhook cannot read."""
    if len(text) > MAX_TOKEN_CHARS:
        raise EngineArgsError(f"{len(text)} characters; at most {MAX_TOKEN_CHARS}", flag="")
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise EngineArgsError(f"engine arguments cannot be split: {exc}", flag="") from None
    return parse_vllm_args(tokens, model=model)
