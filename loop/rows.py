"""Cached hand-written SQL for the statements the loop runs for every step.

Django's query compiler costs 0.2-0.8 ms per statement; the loop runs three to four per
read-only step (and a commit per batch of steps, about 0.2 ms on SQLite:
bench/loop_overhead.py). These helpers build each statement once per shape and convert values
with the model fields' own converters, so rows read and written here are exactly what the ORM
would read and write. Everything runs in
the caller's transaction; nothing here decides whether a change is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

from django.db import connection, connections, models
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)
Converter = Callable[[Any, Any, Any], Any]
Conversion = tuple[int, Any, list[Converter]]  # a column's position, the column, its converters


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


@cache
def _select(model: type[Model], where: str, order: str, for_update: bool, limit: str) -> str:
    meta = model._meta
    columns = ", ".join(_q(f.column) for f in meta.concrete_fields)
    lock = " FOR UPDATE" if for_update and connection.features.has_select_for_update else ""
    tail = f" ORDER BY {order}" if order else ""
    return f"SELECT {columns} FROM {_q(meta.db_table)} WHERE {where}{tail}{limit}{lock}"  # noqa: S608


@cache
def _converters(model: type[Model]) -> list[tuple[Any, list[Converter]]]:
    table = model._meta.db_table
    result = []
    for field in model._meta.concrete_fields:
        col = field.get_col(table)
        found = [*connection.ops.get_db_converters(col), *field.get_db_converters(connection)]  # type: ignore[attr-defined]
        if isinstance(field, models.DateTimeField) and found:
            found = [_remembering(found)]
        result.append((col, found))
    return result


def _remembering(converters: list[Converter]) -> Converter:
    """These converters in turn, remembering what they made of recent values. The same stored
    text comes back again and again (a task's `created_at` on each of its reads, the
    `lease_until` a batch's claims share), and a datetime is immutable, so one parse serves
    every read of it."""
    seen: dict[Any, Any] = {}

    def convert(value: Any, expression: Any, conn: Any) -> Any:
        if value is None:
            return None
        try:
            return seen[value]
        except KeyError:
            pass
        result = value
        for one in converters:
            result = one(result, expression, conn)
        if len(seen) >= 4096:
            seen.clear()
        seen[value] = result
        return result

    return convert


def load(
    model: type[M],
    where: str,
    params: Sequence[Any],
    *,
    order: str = "",
    for_update: bool = False,
) -> M | None:
    """The first row matching `where` (SQL over column names, %s placeholders), or None."""
    found = _fetch(model, _select(model, where, order, for_update, " LIMIT 1"), params)
    return found[0] if found else None


def load_all(
    model: type[M],
    where: str,
    params: Sequence[Any],
    *,
    order: str = "",
    for_update: bool = False,
) -> list[M]:
    """Every row matching `where`, in `order`."""
    return _fetch(model, _select(model, where, order, for_update, ""), params)


def values(
    model: type[Model],
    names: tuple[str, ...],
    where: str,
    params: Sequence[Any],
    *,
    order: str = "",
) -> list[tuple[Any, ...]]:
    """These fields of every row matching `where`, in `order`, as the ORM would read them."""
    sql, conversions = _values(model, names, where, order)
    return [tuple(row) for row in _read(sql, params, conversions)]


@cache
def _values(
    model: type[Model], names: tuple[str, ...], where: str, order: str
) -> tuple[str, list[Conversion]]:
    fields = [_field(model, name) for name in names]
    columns = ", ".join(_q(f.column) for f in fields)
    tail = f" ORDER BY {order}" if order else ""
    sql = f"SELECT {columns} FROM {_q(model._meta.db_table)} WHERE {where}{tail}"  # noqa: S608
    by_field = dict(zip(model._meta.concrete_fields, _converters(model), strict=True))
    selected = [by_field[f] for f in fields]
    return sql, [(n, col, found) for n, (col, found) in enumerate(selected) if found]


@cache
def _conversions(model: type[Model]) -> list[Conversion]:
    """(position, column, converters) of the model's columns that need converting."""
    return [(n, col, found) for n, (col, found) in enumerate(_converters(model)) if found]


def _read(sql: str, params: Sequence[Any], conversions: list[Conversion]) -> list[list[Any]]:
    """The rows `sql` selects, each value converted as the ORM would."""
    conn = connections["default"]
    with conn.cursor() as cursor:
        cursor.execute(sql, list(params))
        found = cursor.fetchall()
    result = []
    for row in found:
        values = list(row)
        for n, col, converters in conversions:
            value = values[n]
            for convert in converters:
                value = convert(value, col, conn)
            values[n] = value
        result.append(values)
    return result


def _fetch(model: type[M], sql: str, params: Sequence[Any]) -> list[M]:
    alias = connections["default"].alias
    return [
        model.from_db(alias, None, values)  # type: ignore[arg-type, misc]
        for values in _read(sql, params, _conversions(model))
    ]


@cache
def _field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete, f"{model.__name__}.{name}"
    return field


Kind = tuple[type | None, str]


@cache
def _kind(field: Field[Any, Any]) -> Kind:
    """The plain Python type the database takes as it is for this field (if any), and how
    other values are adapted: "datetime", "json" or "field" (the field's own way)."""
    if isinstance(field, models.CharField | models.TextField):
        return str, "field"
    if isinstance(field, models.IntegerField | models.BooleanField):
        return int, "field"  # bool is an int
    if isinstance(field, models.DateTimeField):
        return None, "datetime"
    if isinstance(field, models.JSONField):
        return None, "json"
    return None, "field"


_last_datetime: tuple[Any, str, Any] = (None, "", None)


def _prep(field: Field[Any, Any], value: Any, conn: Any, kind: Kind | None = None) -> Any:
    """The value as the database takes it, as `field.get_db_prep_save` would give it."""
    plain, how = kind or _kind(field)
    if value is None or (plain is not None and isinstance(value, plain)):
        return value
    if how == "datetime" and isinstance(value, datetime) and value.tzinfo is not None:
        global _last_datetime
        last = _last_datetime  # one `now` is often written to several rows and fields
        if last[0] is value and last[1] == conn.vendor:
            return last[2]
        adapted = conn.ops.adapt_datetimefield_value(value)
        _last_datetime = (value, conn.vendor, adapted)
        return adapted
    if how == "json" and not hasattr(value, "as_sql"):
        return conn.ops.adapt_json_value(value, field.encoder)  # type: ignore[attr-defined]
    if isinstance(value, Model):
        value = value.pk
    return field.get_db_prep_save(value, conn)


@cache
def _update(
    model: type[Model], names: tuple[str, ...], where: tuple[tuple[str, bool], ...]
) -> tuple[str, list[tuple[Field[Any, Any], Kind]]]:
    """The statement, and the fields of its parameters in order (with their kinds)."""
    sets = ", ".join(f"{_q(_field(model, n).column)} = %s" for n in names)
    conds = " AND ".join(
        f"{_q(_field(model, n).column)} IS NULL" if null else f"{_q(_field(model, n).column)} = %s"
        for n, null in where
    )
    fields = [_field(model, n) for n in names]
    fields += [_field(model, n) for n, null in where if not null]
    sql = f"UPDATE {_q(model._meta.db_table)} SET {sets} WHERE {conds}"  # noqa: S608
    return sql, [(f, _kind(f)) for f in fields]


def update(model: type[Model], changes: dict[str, Any], where: dict[str, Any]) -> int:
    """UPDATE … SET changes WHERE where (equality, or IS NULL for None); the row count."""
    return update_many(model, [changes], [where])


def update_many(
    model: type[Model], changes: list[dict[str, Any]], where: list[dict[str, Any]]
) -> int:
    """`update` for several rows, each with its own values for the same columns and
    conditions, in one statement (executemany); the total row count."""
    conn = connections["default"]
    conds = tuple((name, value is None) for name, value in where[0].items())
    sql, fields = _update(model, tuple(changes[0]), conds)
    params = []
    for sets, match in zip(changes, where, strict=True):
        assert tuple(sets) == tuple(changes[0]), "one statement: the same columns for every row"
        assert tuple((n, v is None) for n, v in match.items()) == conds, "and the same conditions"
        values = [*sets.values(), *(v for v in match.values() if v is not None)]
        params.append(
            [
                value if type(value) is kind[0] else _prep(field, value, conn, kind)
                for (field, kind), value in zip(fields, values, strict=True)
            ]
        )
    with conn.cursor() as cursor:
        if len(params) == 1:
            cursor.execute(sql, params[0])
        else:
            cursor.executemany(sql, params)
        return cursor.rowcount


@cache
def insert_sql(model: type[Model], names: tuple[str, ...], *, returning: bool = True) -> str:
    columns = ", ".join(_q(_field(model, n).column) for n in names)
    marks = ", ".join("%s" for _ in names)
    pk = _q(model._meta.pk.column)  # type: ignore[union-attr]
    tail = f" RETURNING {pk}" if returning else ""
    return f"INSERT INTO {_q(model._meta.db_table)} ({columns}) VALUES ({marks}){tail}"  # noqa: S608


def create_many(model: type[M], values: list[dict[str, Any]]) -> list[M]:
    """New rows from these values (primary keys given) and the model's defaults, as
    `objects.create` would write them (for models without auto_now fields or save()
    overrides), in one statement."""
    conn = connections["default"]
    objs = [model(**one) for one in values]
    fields = [(f, f.attname, _kind(f)) for f in model._meta.concrete_fields]
    names = tuple(f.name for f in model._meta.concrete_fields)
    params = [
        [
            v if type(v := getattr(obj, at)) is kind[0] else _prep(f, v, conn, kind)
            for f, at, kind in fields
        ]
        for obj in objs
    ]
    with conn.cursor() as cursor:
        cursor.executemany(insert_sql(model, names, returning=False), params)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = conn.alias
    return objs


def insert_all(model: type[M], objs: list[M]) -> None:
    """INSERT these new objects, their primary keys left to the database, with one
    executemany of one prepared statement (Django's bulk_create compiles every row's values
    anew: 0.1 ms a row). The objects' pks are not set: read them back by a unique key."""
    conn = connections["default"]
    fields = [(f, f.attname, _kind(f)) for f in model._meta.concrete_fields if not f.primary_key]
    names = tuple(f.name for f, _, _ in fields)
    params = [
        [
            v if type(v := getattr(obj, at)) is kind[0] else _prep(f, v, conn, kind)
            for f, at, kind in fields
        ]
        for obj in objs
    ]
    with conn.cursor() as cursor:
        cursor.executemany(insert_sql(model, names, returning=False), params)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = conn.alias
