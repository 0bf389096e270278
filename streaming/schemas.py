"""Spark schemas derived from the pydantic models, so the JSON the collector writes and the columns the job reads
cannot drift apart (tests/spark/test_streaming_stages.py::test_spark_schemas_carry_the_models_json_unchanged
round-trips real model JSON through them).
"""

from __future__ import annotations

import types
import typing
from enum import Enum
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pyspark.sql import types as T

from detectors.models import CoordinatorRecord, PartitionSnapshot


def _spark_type(annotation: Any) -> tuple[T.DataType, bool]:
    """(Spark type, nullable) for one field annotation."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) != 1:
            raise TypeError(f"unsupported union {annotation}")
        return _spark_type(members[0])[0], True
    if origin is typing.Literal:
        return T.StringType(), False
    if origin is tuple:
        args = get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return T.ArrayType(_spark_type(args[0])[0], containsNull=False), False
        raise TypeError(f"only homogeneous tuples are supported, got {annotation}")
    if origin is dict:
        key, value = get_args(annotation)
        return T.MapType(_spark_type(key)[0], _spark_type(value)[0]), False
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return model_schema(annotation), False
        if issubclass(annotation, Enum):
            return T.StringType(), False
        if issubclass(annotation, bool):
            return T.BooleanType(), False
        if issubclass(annotation, int):
            return T.LongType(), False
        if issubclass(annotation, float):
            return T.DoubleType(), False
        if issubclass(annotation, str):
            return T.StringType(), False
    raise TypeError(f"no Spark type for {annotation!r}")


def model_schema(model: type[BaseModel]) -> T.StructType:
    """The Spark StructType of a pydantic model's JSON (`model_dump_json()`), field by field."""
    fields = []
    for name, info in model.model_fields.items():
        data_type, nullable = _spark_type(info.annotation)
        fields.append(
            T.StructField(info.alias or name, data_type, nullable=nullable or not info.is_required())
        )
    return T.StructType(fields)


PARTITION_SNAPSHOT_SCHEMA = model_schema(PartitionSnapshot)
COORDINATOR_RECORD_SCHEMA = model_schema(CoordinatorRecord)
