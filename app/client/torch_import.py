"""Trace a PyTorch module on the meta device into the service's layer graph (client side only).

``capplan import torch MODULE:FACTORY`` imports ``MODULE``, builds ``FACTORY()`` under
``torch.device("meta")`` (no weights are allocated: a 70B model traces in seconds), runs it
twice on meta tensors at two probe sizes with every module call (forward hooks) and every torch
function (a ``TorchFunctionMode``) recorded, and hands the plain records to
:mod:`app.client.torch_graph`, which turns them into layers without torch. Dimensions that
follow the probe sizes are the symbolic ``batch`` and ``seq`` axes of the stored graph.

PyTorch is an optional extra (``pip install 'capacity-planner[torch]'``): it is imported only
when a trace runs, and the server never imports this module.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from app.client.torch_graph import convert_trace
from app.client.torch_trace import (
    LEAF_MODULE_TYPES,
    MODULE_ATTRIBUTES,
    PROBES,
    TraceError,
    TraceInput,
    merge_probes,
    parse_input,
)

__all__ = [
    "TORCH_MISSING",
    "TraceError",
    "TraceInput",
    "load_factory",
    "parse_input",
    "record_trace",
    "trace_factory",
    "trace_module",
]

TORCH_MISSING = (
    "PyTorch is not installed: `capplan import torch` traces the model on your machine; "
    "install it with: pip install 'capacity-planner[torch]'"
)


def import_torch() -> Any:
    """Import torch lazily; a missing torch is a :class:`TraceError` saying how to install it."""
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise TraceError(TORCH_MISSING) from exc


def load_factory(spec: str) -> Callable[[], Any]:
    """Resolve ``MODULE:FACTORY`` (FACTORY a class or a zero-argument function, may be dotted)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TraceError(f"expected MODULE:FACTORY (e.g. mypkg.models:build), got {spec!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TraceError(f"cannot import module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise TraceError(f"module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise TraceError(f"{spec} is not callable (a class or a zero-argument function)")
    factory: Callable[[], Any] = target
    return factory


def trace_factory(
    factory: Callable[[], Any],
    inputs: Sequence[TraceInput],
    *,
    sequence_length: int | None = None,
) -> dict[str, Any]:
    """Build ``factory()`` on the meta device and trace it (see :func:`trace_module`)."""
    torch = import_torch()
    with torch.device("meta"):
        module = factory()
    if not isinstance(module, torch.nn.Module):
        raise TraceError(f"the factory returned {type(module).__name__}, not a torch.nn.Module")
    return trace_module(module, inputs, sequence_length=sequence_length)


def trace_module(
    module: Any, inputs: Sequence[TraceInput], *, sequence_length: int | None = None
) -> dict[str, Any]:
    """Trace ``module`` (a ``torch.nn.Module``, best on the meta device) into a layer graph.

    Returns ``{"inputs", "layers", "default_bindings", "assumptions"}``: the first three as
    ``POST /v1/models`` accepts them, the last a list of notes on what the conversion assumed.
    The module is traced in training mode (dropout and batch norm as in training) and left in
    the mode it had.
    """
    return convert_trace(record_trace(module, inputs), sequence_length=sequence_length)


def record_trace(module: Any, inputs: Sequence[TraceInput]) -> dict[str, Any]:
    """Run ``module`` at both probe sizes and return the merged, torch-free trace record."""
    torch = import_torch()
    if not isinstance(module, torch.nn.Module):
        raise TraceError(f"expected a torch.nn.Module, got {type(module).__name__}")
    if not inputs:
        raise TraceError("give at least one input (--input NAME:DIMS[:DTYPE])")
    was_training = module.training
    module.train()
    try:
        runs = [_record_once(torch, module, inputs, probe) for probe in PROBES]
    finally:
        module.train(was_training)
    return merge_probes(runs, inputs)


def _example(torch: Any, spec: TraceInput, probe: dict[str, int]) -> Any:
    shape = [probe[d] if isinstance(d, str) else d for d in spec.shape]
    if spec.dtype == "int64":
        return torch.zeros(shape, dtype=torch.int64, device="meta")
    return torch.empty(shape, dtype=torch.float32, device="meta")


def _dtype_name(torch: Any, dtype: Any) -> str:
    if dtype.is_floating_point:
        return "float"
    if dtype == torch.bool:
        return "bool"
    return "int64" if dtype in (torch.int64, torch.int32, torch.int16, torch.int8) else str(dtype)


class _Recorder:
    """Records module calls and torch function calls, with tensors numbered by version."""

    def __init__(self, torch: Any, module: Any) -> None:
        self.torch = torch
        self.events: list[dict[str, Any]] = []
        self.tensors: list[dict[str, Any]] = []
        self.current: dict[int, int] = {}  # id(tensor object) -> its latest tensor number
        self.alive: list[Any] = []  # keeps traced tensors alive, so that ids are not reused
        self.stack: list[int] = []  # open module events
        self.guesses: dict[str, int] = {}  # value reads answered without values
        self.suppressed = 0  # > 0 inside a leaf module: its inner calls are not recorded
        self.param_names: dict[int, str] = {}
        self.params: dict[str, list[int]] = {}
        for name, param in module.named_parameters():
            self.param_names[id(param)] = name
            self.params[name] = list(param.shape)
        self.buffer_names = {id(b): name for name, b in module.named_buffers()}
        self.paths: dict[int, list[str]] = {}  # a module shared by several parents has several
        for path, sub in module.named_modules(remove_duplicate=False):
            self.paths.setdefault(id(sub), []).append(path)

    # -- tensors
    def _register(self, tensor: Any, producer: int | None, **extra: Any) -> int:
        number = len(self.tensors)
        record = {
            "shape": [int(d) for d in tensor.shape],
            "dtype": _dtype_name(self.torch, tensor.dtype),
            "src": producer,
            **extra,
        }
        self.tensors.append(record)
        self.current[id(tensor)] = number
        self.alive.append(tensor)
        return number

    def ref(self, tensor: Any) -> int:
        """The tensor number of an argument (parameters, buffers and strangers on first use)."""
        known = self.current.get(id(tensor))
        if known is not None:
            return known
        if id(tensor) in self.param_names:
            return self._register(tensor, None, param=self.param_names[id(tensor)])
        if id(tensor) in self.buffer_names:
            return self._register(tensor, None, buffer=self.buffer_names[id(tensor)])
        return self._register(tensor, None, const=True)

    def encode(self, value: Any) -> Any:
        """A JSON form of an argument: tensors as {"t": n}."""
        torch = self.torch
        if isinstance(value, torch.Tensor):
            return {"t": self.ref(value)}
        if isinstance(value, bool | int | float | str) or value is None:
            return value
        if isinstance(value, torch.Size):
            return [int(d) for d in value]
        if isinstance(value, list | tuple):
            return [self.encode(v) for v in value]
        if isinstance(value, dict):
            return {str(k): self.encode(v) for k, v in value.items()}
        if isinstance(value, slice):
            return {"slice": [self.encode(value.start), self.encode(value.stop), value.step]}
        if value is Ellipsis:
            return {"ellipsis": True}
        if isinstance(value, torch.dtype):
            return {"dtype": str(value)}
        if hasattr(value, "to_tuple") and callable(value.to_tuple):  # transformers ModelOutput
            return [self.encode(v) for v in value.to_tuple()]
        return {"repr": type(value).__name__}

    def outputs(self, value: Any, producer: int, *, renumber: bool) -> Any:
        """Number the tensors in an output (new versions, or kept if ``renumber`` is False)."""
        torch = self.torch
        if isinstance(value, torch.Tensor):
            if not renumber and id(value) in self.current:
                return {"t": self.current[id(value)]}
            return {"t": self._register(value, producer)}
        if isinstance(value, list | tuple):
            return [self.outputs(v, producer, renumber=renumber) for v in value]
        if hasattr(value, "to_tuple") and callable(value.to_tuple):
            return [self.outputs(v, producer, renumber=renumber) for v in value.to_tuple()]
        return self.encode(value)

    # -- events
    def call(self, name: str, args: Any, kwargs: Any, result: Any) -> None:
        if self.suppressed or not _holds_tensor(self.torch, result):
            return
        event = {
            "id": len(self.events),
            "kind": "call",
            "fn": name,
            "parent": self.stack[-1] if self.stack else None,
            "args": self.encode(list(args)),
            "kwargs": self.encode(dict(kwargs or {})),
        }
        self.events.append(event)
        event["out"] = self.outputs(result, event["id"], renumber=True)

    def enter(self, module: Any, args: Any, kwargs: Any) -> None:
        type_name = type(module).__name__
        if self.suppressed:
            if _is_leaf(type_name):
                self.suppressed += 1
            return
        attrs = {}
        for key in MODULE_ATTRIBUTES:
            value = getattr(module, key, None)
            if key == "bias" and not isinstance(value, bool):
                value = value is not None if hasattr(module, "bias") else None
            elif key == "weight":
                value = (
                    getattr(module, "weight", None) is not None
                    if hasattr(module, "weight")
                    else None
                )
            encoded = _plain(value)
            if encoded is not None:
                attrs[key] = encoded
        event = {
            "id": len(self.events),
            "kind": "module",
            "type": type_name,
            "path": self.path(module),
            "parent": self.stack[-1] if self.stack else None,
            "attrs": attrs,
            "params": {  # a leaf's own and its children's (MultiheadAttention.out_proj)
                local: self.param_names.get(id(p), local)
                for local, p in module.named_parameters(recurse=_is_leaf(type_name))
            },
            "args": self.encode(list(args)),
            "kwargs": {k: self.encode(v) for k, v in (kwargs or {}).items() if v is not None},
        }
        self.events.append(event)
        self.stack.append(event["id"])
        if _is_leaf(type_name):
            self.suppressed += 1

    def path(self, module: Any) -> str:
        """The module's path: for one instance registered under several parents (MLPerf's 3D
        U-Net shares one ``nn.ReLU()``), the path under the parent running now."""
        paths = self.paths.get(id(module), ["?"])
        if len(paths) > 1 and self.stack:
            parent = self.events[self.stack[-1]]["path"]
            for path in paths:
                if path.rpartition(".")[0] == parent:
                    return path
        return paths[0]

    def leave(self, module: Any, result: Any) -> None:
        type_name = type(module).__name__
        leaf = _is_leaf(type_name)
        if self.suppressed > (1 if leaf else 0):
            if leaf:
                self.suppressed -= 1
            return
        if leaf:
            self.suppressed -= 1
        event_id = self.stack.pop()
        self.events[event_id]["out"] = self.outputs(result, event_id, renumber=leaf)


# Value reads on meta tensors and what the trace assumes they return.
_DATA_DEPENDENT: dict[str, Any] = {"__bool__": True, "item": 0, "tolist": [], "__int__": 0}


def _on_meta(args: Any) -> bool:
    return bool(args) and getattr(getattr(args[0], "device", None), "type", None) == "meta"


def _is_leaf(type_name: str) -> bool:
    return type_name in LEAF_MODULE_TYPES or type_name.endswith("RMSNorm")


def _holds_tensor(torch: Any, value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, list | tuple):
        return any(_holds_tensor(torch, v) for v in value)
    return False


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return list(value)
    return None


def _record_once(
    torch: Any, module: Any, inputs: Sequence[TraceInput], probe: dict[str, int]
) -> dict[str, Any]:
    recorder = _Recorder(torch, module)
    examples = {spec.name: _example(torch, spec, probe) for spec in inputs}
    for spec in inputs:
        tensor = examples[spec.name]
        recorder._register(tensor, None, input=spec.name)

    overrides: Any = importlib.import_module("torch.overrides")

    class Mode(overrides.TorchFunctionMode):  # type: ignore[misc]
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", None) or type(func).__name__
            if name in _DATA_DEPENDENT and _on_meta(args):
                # A branch on tensor values (e.g. "is the mask all ones?"): meta tensors have no
                # values, so the trace takes the plain path and says so.
                recorder.guesses[name] = recorder.guesses.get(name, 0) + 1
                return _DATA_DEPENDENT[name]
            result = func(*args, **kwargs)
            if name == "__get__":  # properties such as .T
                name = getattr(getattr(func, "__self__", None), "__name__", name)
            recorder.call(name, args, kwargs, result)
            return result

    handles = []
    for sub in module.modules():
        handles.append(
            sub.register_forward_pre_hook(lambda m, a, k: recorder.enter(m, a, k), with_kwargs=True)
        )
        handles.append(
            sub.register_forward_hook(lambda m, a, k, out: recorder.leave(m, out), with_kwargs=True)
        )
    call_kwargs: dict[str, Any] = {}
    positional: list[Any] = []
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    if all(spec.name in parameters for spec in inputs):
        call_kwargs = dict(examples)
    else:
        positional = [examples[spec.name] for spec in inputs]
    if "use_cache" in parameters:
        call_kwargs["use_cache"] = False
    try:
        with torch.device("meta"), torch.no_grad(), Mode():
            module(*positional, **call_kwargs)
    except TraceError:
        raise
    except Exception as exc:
        raise TraceError(
            f"the module's forward failed on meta tensors {_shapes(inputs, probe)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    finally:
        for handle in handles:
            handle.remove()
    return {
        "probe": dict(probe),
        "params": recorder.params,
        "buffers": sorted(set(recorder.buffer_names.values())),
        "tensors": recorder.tensors,
        "events": recorder.events,
        "guesses": recorder.guesses,
    }


def _shapes(inputs: Sequence[TraceInput], probe: dict[str, int]) -> str:
    def dims(spec: TraceInput) -> str:
        return ", ".join(str(probe[d]) if isinstance(d, str) else str(d) for d in spec.shape)

    return ", ".join(f"{spec.name}[{dims(spec)}]" for spec in inputs)
