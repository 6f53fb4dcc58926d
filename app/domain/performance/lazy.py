"""A tuple whose items are built when first read (pure).

A recommendation prices a phase from one kernel per run of alike kernels, so building every
kernel of every batch size, precision and tensor-parallel share as a frozen object would cost
more than the pricing: :class:`~app.domain.performance.kernels.KernelCounts` and
:class:`~app.domain.performance.phases.LazyKernels` are read as tuples but build an item only
when it is read, and the whole tuple only when it is iterated, sliced, compared or hashed.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import TypeVar, overload

T = TypeVar("T")


class LazyTuple(Sequence[T]):
    """``size`` items, read as a tuple of them; item ``i`` is ``self._make(i)``, built when first
    read and then kept. Equal to a tuple (or another lazy tuple) of the same items."""

    __slots__ = ("_all", "_built", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._built: dict[int, T] = {}
        self._all: tuple[T, ...] | None = None

    @abstractmethod
    def _make(self, index: int) -> T:
        """Build item ``index`` (0 <= index < size)."""

    def _one(self, index: int) -> T:
        found = self._built.get(index)
        if found is None:
            found = self._built[index] = self._make(index)
        return found

    def _every(self) -> tuple[T, ...]:
        if self._all is None:
            self._all = tuple(self._one(i) for i in range(self._size))
        return self._all

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice) or self._all is not None:
            return self._every()[index]
        position = index + self._size if index < 0 else index
        if not 0 <= position < self._size:
            raise IndexError("kernel index out of range")
        return self._one(position)

    def __iter__(self) -> Iterator[T]:
        return iter(self._every())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyTuple | tuple):
            return self._every() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._every())

    def __repr__(self) -> str:
        return repr(self._every())
