"""Pydantic's validation errors, reworded for a person editing cluster.toml: a missing field
says what it is, an unknown field lists the valid ones, a wrong value shows what was given."""

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from specctl.config.errors import Loc

MAX_SHOWN_CHARS = 60


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (`X`, `list[X]`, `X | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    if isinstance(annotation, types.UnionType):
        return None
    return None


def _walk(root: type[BaseModel], loc: Loc) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model that holds the last field of `loc`, and that field's info."""
    model: type[BaseModel] | None = root
    info: FieldInfo | None = None
    for index, part in enumerate(loc):
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return model, None
        info = model.model_fields[part]
        if index < len(loc) - 1:
            model = _submodel(info.annotation)
    return model, info


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def describe(root: type[BaseModel], error: ErrorDetails) -> str:
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "missing":
        _, info = _walk(root, loc)
        about = f": {info.description}" if info and info.description else ""
        return f"required field missing{about}"
    if kind == "extra_forbidden":
        parent, _ = _walk(root, (*loc[:-1], "__none__"))
        valid = ", ".join(parent.model_fields) if parent else ""
        return f"unknown field; valid fields here: {valid}" if valid else "unknown field"
    message = error["msg"].removeprefix("Value error, ")
    if kind == "value_error":
        return message
    if kind == "model_type":  # a table where a value belongs, or the reverse
        return f"must be a table ([section] or {{ key = value }}), got {_shown(error['input'])}"
    return f"{message}, got {_shown(error['input'])}"
