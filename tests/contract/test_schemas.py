"""Schema contract: nothing the API may omit is declared required.

Routes answer with ``response_model_exclude_none``, so a field that may be null is left out
of the JSON. If its schema had no default, the OpenAPI document would call it required and
any client validating against it (``app.client`` included) would reject the answer.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
import typing

from pydantic import BaseModel

import app.schemas


def _schema_classes() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    # walk_packages: schema packages (app.schemas.recommendations) hold their classes in modules.
    for info in pkgutil.walk_packages(app.schemas.__path__, prefix="app.schemas."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseModel) and cls.__module__ == module.__name__:
                found.append(cls)
    return found


def _nullable(annotation: object) -> bool:
    origin = typing.get_origin(annotation)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def test_schemas_are_found() -> None:
    names = {cls.__name__ for cls in _schema_classes()}
    assert {"MemoryEstimateResponse", "InferenceRecommendationResponse", "ImportReport"} <= names


def test_no_field_is_both_required_and_nullable() -> None:
    offenders = [
        f"{cls.__module__}.{cls.__name__}.{name}"
        for cls in _schema_classes()
        for name, field in cls.model_fields.items()
        if field.is_required() and _nullable(field.annotation)
    ]
    assert offenders == []
