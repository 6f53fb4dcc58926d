"""Query parameters shared by several routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

BatchSizeQuery = Annotated[int, Query(ge=1, le=1_048_576, description="Batch size.")]
SequenceLengthQuery = Annotated[
    int | None, Query(ge=1, le=16_777_216, description="Binds `seq` (tokens).")
]
ImageSizeQuery = Annotated[
    int | None, Query(ge=1, le=16_777_216, description="Binds `image` (pixels per side).")
]
