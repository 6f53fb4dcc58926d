"""The lazy tuple the kernel lists share (app.domain.performance.lazy): read as a tuple, each
item built once, when first read."""

from __future__ import annotations

import pytest

from app.domain.performance.lazy import LazyTuple


class Squares(LazyTuple[int]):
    __slots__ = ("made",)

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.made: list[int] = []

    def _make(self, index: int) -> int:
        self.made.append(index)
        return index * index


def test_an_item_is_built_once_when_read() -> None:
    squares = Squares(5)
    assert len(squares) == 5
    assert squares.made == []
    assert (squares[3], squares[-1], squares[3]) == (9, 16, 9)
    assert squares.made == [3, 4]  # item 3 kept, item -1 is item 4


def test_it_reads_as_the_tuple_of_its_items() -> None:
    squares = Squares(4)
    assert squares == (0, 1, 4, 9)
    assert squares == Squares(4)
    assert squares != (0, 1, 4)
    assert squares != (0, 1, 4, 10)
    assert hash(squares) == hash((0, 1, 4, 9))
    assert squares[1:3] == (1, 4)
    assert list(squares) == [0, 1, 4, 9]
    assert repr(squares) == "(0, 1, 4, 9)"
    assert squares.made == [0, 1, 2, 3]  # each built once for all of that


@pytest.mark.parametrize("index", [4, -5])
def test_an_index_outside_is_an_index_error(index: int) -> None:
    with pytest.raises(IndexError):
        Squares(4)[index]
