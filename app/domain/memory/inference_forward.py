"""An inference forward's allocator events, built from a template shared by the forwards of one
model: at other batch sizes and precisions a forward has the same events but for their bytes
(the same layers allocate, free and take transients, in the same order, under the same keys),
so the order of the events is worked out once and each forward only fills its bytes in."""

from __future__ import annotations

from operator import attrgetter
from typing import NamedTuple

from app.domain.budget import checkpoint
from app.domain.graph.analysis import GraphAnalysis
from app.domain.memory.cuda_allocator import Event
from app.domain.memory.liveness import StoragePlan
from app.domain.memory.memo import LayerColumns, PlanMemo, layer_columns

# Keys of the forward's own tensors: their position in the forward plus this, above any index of
# a step's events (which key the head's and the backward's tensors), so the forward's events
# can be built once and follow any head.
FORWARD_KEYS = 1 << 48

_FORWARD_TRANSIENT = attrgetter("forward_transient")


class _Shape(NamedTuple):
    """What the order and keys of an inference forward's events depend on: per layer its
    output storage, whether it allocates an output and whether it takes a transient; the
    plan's last readers (and their order: the order of the frees after a layer), kept and
    pinned storages, and the model's inputs."""

    storages: tuple[int, ...]
    allocates: tuple[bool, ...]
    transients: tuple[bool, ...]
    read: tuple[int, ...]  # the storages of last_use, in its order (dicts compare without)
    last_use: dict[int, int]
    first_saver: dict[int, int]
    pinned: frozenset[int]
    inputs: frozenset[int]


class Template(NamedTuple):
    """An inference forward's events without their bytes: per event its kind, its key and
    where its bytes come from (an index into a forward's outputs' bytes, then its transients'
    bytes, then a 0), and the keys allocated and still live at its end, in order."""

    shape: _Shape
    kinds: list[str]
    keys: list[int]
    sources: list[int]
    live: list[int]  # storages allocated and not freed by the end (the caller's output)
    live_keys: tuple[int, ...]  # the keys allocated and not freed, in order of allocation

    def first_alloc(self, key: int) -> int:
        """The index of the first allocation of ``key`` (-1: none)."""
        at = -1
        while True:
            try:
                at = self.keys.index(key, at + 1)
            except ValueError:
                return -1
            if self.kinds[at] == "alloc":
                return at


def _shape(analysis: GraphAnalysis, plan: StoragePlan, storages: tuple[int, ...]) -> _Shape:
    return _Shape(
        storages=storages,
        allocates=tuple(map(bool, plan.out_alloc)),
        transients=tuple(map(bool, map(_FORWARD_TRANSIENT, plan.op_sizes))),
        read=tuple(plan.last_use),
        last_use=plan.last_use,
        first_saver=plan.first_saver,
        pinned=frozenset(plan.pinned),
        inputs=frozenset(bound.storage for bound in analysis.inputs),
    )


def _template(shape: _Shape) -> Template:
    """The events of :func:`app.domain.memory.allocator_events._forward_events` at inference
    (no autocast copy, nothing kept): per layer its output (allocated), its forward transient
    (allocated and freed at once) and the values whose last reader it is (freed)."""
    freed_after: dict[int, list[int]] = {}
    for storage, index in shape.last_use.items():
        if (
            storage not in shape.first_saver
            and storage not in shape.pinned
            and storage not in shape.inputs
        ):
            freed_after.setdefault(index, []).append(storage)
    layers = len(shape.storages)
    kinds: list[str] = []
    keys: list[int] = []
    sources: list[int] = []
    live: dict[int, None] = {}
    for index, (storage, allocates, transient) in enumerate(
        zip(shape.storages, shape.allocates, shape.transients, strict=True)
    ):
        if allocates:
            kinds.append("alloc")
            keys.append(~storage)
            sources.append(index)
            live[storage] = None
        if transient:
            kinds.append("scratch")
            keys.append(FORWARD_KEYS + len(keys))
            sources.append(layers + index)
        for freed in freed_after.get(index, ()):
            if freed in live:
                del live[freed]
                kinds.append("free")
                keys.append(~freed)
                sources.append(2 * layers)
    allocated: dict[int, None] = {}  # as _warm_up_forward finds them: by kind and key alone
    for kind, key in zip(kinds, keys, strict=True):
        if kind == "alloc":
            allocated[key] = None
        elif kind == "free":
            allocated.pop(key, None)
    return Template(shape, kinds, keys, sources, list(live), tuple(allocated))


def forward_template(
    analysis: GraphAnalysis,
    plan: StoragePlan,
    memo: PlanMemo | None,
    columns: LayerColumns | None = None,
) -> Template:
    """The template of the inference forward of ``analysis`` under ``plan``: the one stored in
    ``memo`` for the last forward of that many layers if its shape is this one's (compared in
    full, not trusted: a shape that differs in anything gets its own), else built.
    ``columns``: the analysis's :func:`layer_columns`, if known."""
    shape = _shape(analysis, plan, (columns or layer_columns(memo, analysis)).storages)
    slot = ("inference forward template", len(shape.storages))
    found = memo.get(slot) if memo is not None else None
    if isinstance(found, Template) and found.shape == shape:
        return found
    # stored with copies of the plan's dicts (a later edit of them cannot change its shape)
    template = _template(
        shape._replace(last_use=dict(shape.last_use), first_saver=dict(shape.first_saver))
    )
    if memo is not None:
        memo.put(slot, template)
    return template


def fill(template: Template, plan: StoragePlan) -> tuple[list[Event], list[int]]:
    """The events of ``template`` with the bytes of ``plan``'s outputs and transients, and
    their bytes (event by event)."""
    checkpoint()  # app.domain.budget: stop here past the request's deadline
    sizes = [*plan.out_alloc, *map(_FORWARD_TRANSIENT, plan.op_sizes), 0]
    filled = list(map(sizes.__getitem__, template.sources))
    return list(zip(template.kinds, template.keys, filled, strict=True)), filled
