"""The loop's hot statements, written by hand, in one place; everything else uses the ORM.

Why by hand: Django's query compiler costs 0.2-0.8 ms per statement, against a durable commit
of 0.1-0.3 ms on SQLite, and the loop runs three to four statements per read-only step (commit
b8e0da5 and bench/loop_overhead.py, whose target is a no-op step at or above raw two-commit
SQLite transactions). The generic helpers below build each statement once per shape and
convert values with the model fields' own converters, so rows read and written here are
exactly what the ORM would read and write. The named statements after them say each which
query it serves and why the ORM cannot (or may not) write it. Table and column names come
from the models' `_meta`, conditions from the models' own rules (`models.claimable_at`,
`OPEN_STEP`, `FAILED_STEP`), compiled by the ORM once.

Everything runs in the caller's transaction; nothing here decides whether a change is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection, connections, models, transaction
from django.db.models import Field, Model, Q
from django.db.models.sql.query import Query
from django.utils import timezone

from .models import (
    CLAIM_ORDER,
    CLAIMABLE_TASK,
    FAILED_STEP,
    OPEN_STEP,
    OPEN_STEP_ORDER,
    Step,
    Task,
    Worker,
    WorkerState,
    claimable_at,
    lease_free_at,
    retry_due_at,
)

M = TypeVar("M", bound=Model)
Converter = Callable[[Any, Any, Any], Any]
Conversion = tuple[int, Any, list[Converter]]  # a column's position, the column, its converters


def _cursor(conn: Any) -> Any:
    """A cursor for the hot statements below. On PostgreSQL (unless LOOP_PG_PREPARE is off)
    the server binds their parameters and each statement is prepared once per connection,
    so it is parsed and planned once, not at every call, and psycopg does not write every
    value into the statement's text (a batch's arrays go in binary, `%b`, with no escaping):
    a side-effect step 5.1-6.1 -> 3.2-4.1 ms, a read-only one 2.0-3.0 -> 1.5-1.7 ms in
    process (bench/pg_throughput.py --explain). While Django logs queries (DEBUG, a test
    capturing them) it is Django's usual cursor, so the log shows each statement with its
    values written in."""
    if conn.vendor != "postgresql" or conn.queries_logged or not settings.LOOP_PG_PREPARE:
        return conn.cursor()
    conn.close_if_health_check_failed()
    conn.ensure_connection()
    raw = conn.connection
    if raw.prepare_threshold is None:
        # Django turns preparing off for the whole connection (Database.Cursor's default
        # otherwise prepares any statement run five times). Ours ask for it by name; the
        # ORM's client-side cursors never prepare, whatever the threshold.
        raw.prepare_threshold = 1 << 30
    with conn.wrap_database_errors:
        cursor = conn.make_cursor(_prepared_cursor_class()(raw))
    conn.validate_thread_sharing()
    return cursor


@cache
def _prepared_cursor_class() -> type:
    from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]

    class PreparedCursor(ServerBindingCursor):  # type: ignore[misc, valid-type]
        """Django's server-binding cursor, preparing every statement it runs."""

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", True)
            return super().execute(query, params, **kwargs)

    return PreparedCursor


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


@contextmanager
def snapshot() -> Iterator[None]:
    """Reads that all see one moment of the database, so the parts of a page rendered from
    several queries agree (a task's counters and its step rows, pushed while a worker commits).
    A transaction that only reads: on SQLite a deferred BEGIN, a reader that never takes the
    write lock (BEGIN IMMEDIATE, the site's default, would wait for the worker and stop it);
    on PostgreSQL REPEATABLE READ, whose statements share the first one's snapshot. Inside a
    transaction already, that transaction is the moment."""
    if connection.in_atomic_block:
        yield
        return
    connection.ensure_connection()
    with ExitStack() as stack:
        if connection.vendor == "sqlite":
            mode = connection.transaction_mode  # type: ignore[attr-defined]
            connection.transaction_mode = "DEFERRED"  # type: ignore[attr-defined]
            try:
                stack.enter_context(transaction.atomic())
            finally:
                connection.transaction_mode = mode  # type: ignore[attr-defined]
        else:
            stack.enter_context(transaction.atomic())
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


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
    """Every row matching `where`, in `order`. The tick reads its claimed tasks with it, the
    outbox a batch's effects (with the compiler's cost, 0.2-0.8 ms, paid once per shape)."""
    return _fetch(model, _select(model, where, order, for_update, ""), params)


def by_ids(model: type[M], ids: Sequence[Any], *, for_update: bool = False) -> list[M]:
    """The rows with these primary keys, in key order (locked in that order with
    `for_update`, so two workers locking overlapping sets never deadlock). The fenced read of
    every batch commit (lease.fenced_all), once per batch of verdicts: 0.3-0.5 ms, against
    4-8 ms for `select_for_update().filter(pk__in=…)` on the same busy machine."""
    if not ids:
        return []
    pk = _q(model._meta.pk.column)  # type: ignore[union-attr]
    among, params = _among(pk, ids)
    return load_all(model, among, params, order=pk, for_update=for_update)


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("%s" for _ in values)


def _among(column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    """`column` is one of `values`, and the parameters: on PostgreSQL one array (`= ANY`), so
    one prepared statement serves every count; elsewhere `IN (%s, …)`."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [list(values)]
    return f"{column} IN ({_marks(values)})", list(values)


@cache
def _conversions(model: type[Model]) -> list[Conversion]:
    """(position, column, converters) of the model's columns that need converting."""
    return [(n, col, found) for n, (col, found) in enumerate(_converters(model)) if found]


def _read(sql: str, params: Sequence[Any], conversions: list[Conversion]) -> list[list[Any]]:
    """The rows `sql` selects, each value converted as the ORM would."""
    conn = connections["default"]
    with _cursor(conn) as cursor:
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
    """UPDATE … SET changes WHERE where (equality, or IS NULL for None); the row count. A
    released lease (lease.release) at the end of every task's chain of steps: 0.12-0.14 ms,
    against 1.3-2.0 ms for `objects.filter(pk=…).update(…)` (a microbenchmark on a busy
    two-core machine, in one transaction)."""
    return update_many(model, [changes], [where])


def update_many(
    model: type[Model], changes: list[dict[str, Any]], where: list[dict[str, Any]]
) -> int:
    """`update` for several rows, each with its own values for the same columns and
    conditions, in one statement (`_update_rows`); the total row count. The compare-and-set of
    every state change (loop.transitions): a batch's starts, verdicts and effect claims, set-
    wise (commit f17186c), the statement built once per shape, not compiled."""
    return sum(cursor.rowcount for cursor in _updates(model, changes, where))


def update_each(
    model: type[Model], changes: list[dict[str, Any]], where: list[dict[str, Any]]
) -> set[Any]:
    """`update_many`, telling which rows it changed: their primary keys (RETURNING). A
    compare-and-set of several rows where each that still matches may move on its own."""
    pk = f"{_q(model._meta.db_table)}.{_q(model._meta.pk.column)}"  # type: ignore[union-attr]
    updates = _updates(model, changes, where, tail=f" RETURNING {pk}")
    return {row[0] for cursor in updates for row in cursor.fetchall()}


def _updates(
    model: type[Model], changes: list[dict[str, Any]], where: list[dict[str, Any]], tail: str = ""
) -> Iterator[Any]:
    """The statements of `update_many` (each followed by `tail`), a chunk of rows at a time:
    the cursor after each."""
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
    with _cursor(conn) as cursor:
        for chunk in _chunks(params):
            if len(chunk) == 1:
                cursor.execute(sql + tail, chunk[0])
            else:
                rows = _update_rows(model, tuple(changes[0]), conds, _count(chunk), conn.vendor)
                cursor.execute(rows + tail, _rows_params(chunk, conn.vendor))
            yield cursor


ROWS_AT_ONCE = 500  # rows in one multi-row statement, well inside both databases' limits


def _chunks(params: list[list[Any]]) -> list[list[list[Any]]]:
    return [params[n : n + ROWS_AT_ONCE] for n in range(0, len(params), ROWS_AT_ONCE)]


def _count(chunk: list[list[Any]]) -> int:
    """The row count a multi-row statement is built for: on PostgreSQL any (its rows come as
    arrays, one parameter per column), on SQLite this chunk's."""
    return 0 if connection.vendor == "postgresql" else len(chunk)


def _rows(fields: Sequence[Field[Any, Any]], count: int, vendor: str) -> tuple[str, list[str]]:
    """A FROM item that yields rows of these fields' values, and the names of its columns.
    PostgreSQL: `unnest(%b::type[], …) AS v(c1, …)`, one array parameter per column, so the
    statement stays short and its parameters few whatever the row count (psycopg parses the
    placeholders of a statement with more than 50 parameters anew at every call, 0.4 ms);
    SQLite: `(VALUES (%s, …), …) AS v`, whose columns are v.column1, v.column2, …. Each
    array is of the column's type without its length, so a value too long fails as in a
    plain UPDATE, never cut."""
    if vendor == "postgresql":
        kinds = [re.sub(r"\(.*\)", "", f.cast_db_type(connection) or "") for f in fields]  # type: ignore[attr-defined]
        names = [f"c{n + 1}" for n in range(len(fields))]
        arrays = ", ".join(f"%b::{kind}[]" for kind in kinds)
        return f"unnest({arrays}) AS v({', '.join(names)})", [f"v.{n}" for n in names]
    marks = ", ".join(f"({_marks(fields)})" for _ in range(count))
    return f"(VALUES {marks}) AS v", [f"v.column{n + 1}" for n in range(len(fields))]


def _rows_params(chunk: list[list[Any]], vendor: str) -> list[Any]:
    """`_rows`' parameters for these rows: on PostgreSQL a list per column, else row by row."""
    if vendor == "postgresql":
        return [list(column) for column in zip(*chunk, strict=True)]
    return [value for row in chunk for value in row]


@cache
def _update_rows(
    model: type[Model],
    names: tuple[str, ...],
    where: tuple[tuple[str, bool], ...],
    count: int,
    vendor: str,
) -> str:
    """`_update`'s statement for many rows at once, UPDATE … FROM `_rows` AS v, each row's
    values in `_update`'s parameter order: one statement, parsed and planned once, instead of
    one per row (on PostgreSQL an executemany sends and plans each row's statement apart)."""
    table = _q(model._meta.db_table)
    fields = [_field(model, n) for n in names]
    fields += [_field(model, n) for n, null in where if not null]
    source, values = _rows(fields, count, vendor)
    sets = ", ".join(f"{_q(f.column)} = {values[n]}" for n, f in enumerate(fields[: len(names)]))
    conds = []
    n = len(names)
    for name, null in where:
        column = f"{table}.{_q(_field(model, name).column)}"
        if null:
            conds.append(f"{column} IS NULL")
        else:
            conds.append(f"{column} = {values[n]}")
            n += 1
    return f"UPDATE {table} SET {sets} FROM {source} WHERE {' AND '.join(conds)}"  # noqa: S608


@cache
def _insert_one(model: type[Model], names: tuple[str, ...]) -> str:
    columns = ", ".join(_q(_field(model, n).column) for n in names)
    marks = ", ".join("%s" for _ in names)
    pk = _q(model._meta.pk.column)  # type: ignore[union-attr]
    return f"INSERT INTO {_q(model._meta.db_table)} ({columns}) VALUES ({marks}) RETURNING {pk}"  # noqa: S608


def create(model: type[M], values: dict[str, Any]) -> M:
    """A new row from these values and the model's defaults, its primary key the database's,
    as `objects.create` would write it (for models without auto_now fields or save()
    overrides), with a statement built once per model: a model step's transcript entries,
    several per turn, each of which `objects.create` would compile anew."""
    obj = model(**values)
    conn = connections["default"]
    concrete = [f for f in model._meta.concrete_fields if not f.primary_key]
    params = [
        v
        if type(v := getattr(obj, f.attname)) is (kind := _kind(f))[0]
        else _prep(f, v, conn, kind)
        for f in concrete
    ]
    with _cursor(conn) as cursor:
        cursor.execute(_insert_one(model, tuple(f.name for f in concrete)), params)
        obj.pk = cursor.fetchone()[0]
    obj._state.adding = False
    obj._state.db = conn.alias
    return obj


def create_many(model: type[M], values: list[dict[str, Any]]) -> list[M]:
    """New rows from these values (primary keys given) and the model's defaults, as
    `objects.create` would write them (for models without auto_now fields or save()
    overrides), in one statement. A batch's effect intents (effects.intend_all), written
    with the steps' start: one statement instead of a compiled INSERT per effect."""
    objs = [model(**one) for one in values]
    _insert(model, objs, list(model._meta.concrete_fields))
    return objs


def insert_all(model: type[M], objs: list[M]) -> None:
    """INSERT these new objects, their primary keys left to the database, with one statement
    built once per shape (Django's bulk_create compiles every row's values anew: 0.1 ms a
    row). The objects' pks are not set: read them back by a unique key."""
    _insert(model, objs, [f for f in model._meta.concrete_fields if not f.primary_key])


def _insert(model: type[M], objs: list[M], concrete: list[Any]) -> None:
    """`objs`' values of these fields, prepared as the database takes them, in one
    statement; then the objects count as saved."""
    conn = connections["default"]
    fields = [(f, f.attname, _kind(f)) for f in concrete]
    names = tuple(f.name for f in concrete)
    params = [
        [
            v if type(v := getattr(obj, at)) is kind[0] else _prep(f, v, conn, kind)
            for f, at, kind in fields
        ]
        for obj in objs
    ]
    insert_rows(model, names, params)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = conn.alias


def insert_rows(model: type[Model], names: tuple[str, ...], params: list[list[Any]]) -> None:
    """INSERT these rows' values, already as the database takes them, for the fields `names`,
    with one cached multi-row statement (`_insert_rows`). The journal writes each event with it
    (`journal.record`, a batch's events at once in `journal.batched`): several per step, each
    of which `Event.objects.create` would compile anew (commit 0ccbeae)."""
    conn = connections["default"]
    with _cursor(conn) as cursor:
        for chunk in _chunks(params):
            sql = _insert_rows(model, names, _count(chunk), conn.vendor)
            cursor.execute(sql, _rows_params(chunk, conn.vendor))


@cache
def _insert_rows(model: type[Model], names: tuple[str, ...], count: int, vendor: str) -> str:
    """INSERT of many rows in one statement (… SELECT FROM `_rows`): parsed and planned once,
    where an executemany would send and plan one statement per row (on PostgreSQL)."""
    columns = ", ".join(_q(_field(model, n).column) for n in names)
    source, values = _rows([_field(model, n) for n in names], count, vendor)
    table = _q(model._meta.db_table)
    return f"INSERT INTO {table} ({columns}) SELECT {', '.join(values)} FROM {source}"  # noqa: S608


# ---- conditions: the models' rules, compiled by the ORM once --------------------------------


_SOME_TIME = datetime(2000, 1, 1, tzinfo=UTC)


@cache
def _timed(model: type[Model], rule: Callable[[datetime], Q], vendor: str) -> tuple[str, int]:
    """The WHERE fragment the ORM writes for `rule(now)` over `model`'s columns, and how many
    parameters it takes (each of them is `now`). Compiled once: 0.5 ms each time otherwise.
    On PostgreSQL `now` is the server's own clock, written in (`_now_sql`): no parameter."""
    query = Query(model=model, alias_cols=False)
    where = query.build_where(rule(_SOME_TIME))
    sql, params = where.as_sql(query.get_compiler(connection=connection), connection)
    some_time = connection.ops.adapt_datetimefield_value(_SOME_TIME)
    assert all(p == some_time for p in params), f"{rule.__name__}: parameters other than now"
    if vendor == "postgresql":
        return f"({sql % tuple(_now_sql(vendor) for _ in params)})", 0
    return f"({sql})", len(params)


def _now_sql(vendor: str) -> str:
    """`now` in a statement that writes or compares a lease, a heartbeat or a retry's due
    time (loop/clock.py, one clock): PostgreSQL's `statement_timestamp()`, the server's clock
    at the statement's start (stable within it, so the planner treats it as a parameter); on
    SQLite a parameter, this host's time, which is the database's."""
    return "statement_timestamp()" if vendor == "postgresql" else "%s"


def _now_params(vendor: str, seconds: float) -> tuple[list[Any], Any]:
    """The parameters that stand for `now` and for `now + seconds` in a statement built with
    `_now_sql` and `_until_sql`: on PostgreSQL none and an interval, on SQLite both times."""
    if vendor == "postgresql":
        return [], timedelta(seconds=seconds)
    at = timezone.now()
    return [_db(at)], _db(at + timedelta(seconds=seconds))


def _until_sql(vendor: str) -> str:
    """`now + seconds` (its one parameter: `_now_params`' second value)."""
    return "statement_timestamp() + %s" if vendor == "postgresql" else "%s"


@cache
def _literal(model: type[Model], condition: Q, vendor: str) -> str:
    """The WHERE fragment of `condition` with its values written in, exactly as a partial
    index's own condition is written (Django's `Index._get_condition_sql`): a partial index
    serves a query only when the planner sees that the query's WHERE implies the index's, and
    neither SQLite nor PostgreSQL proves that through a bound parameter."""
    query = Query(model=model, alias_cols=False)
    where = query.build_where(condition)
    sql, params = where.as_sql(query.get_compiler(connection=connection), connection)
    editor = connection.SchemaEditorClass(connection)
    return f"({sql % tuple(editor.quote_value(p) for p in params)})"


def _col(model: type[Model], name: str) -> str:
    return _q(_field(model, name).column)


# ---- leases (loop.lease) -------------------------------------------------------------------


@cache
def _claimable_in_order(vendor: str) -> tuple[str, int]:
    """`WHERE … ORDER BY …` of the tasks claimable at a time (its parameter, that many
    times): `models.CLAIMABLE_TASK` with the states as literals, `claimable_at`, and
    CLAIM_ORDER, the order of the index task_claim. The claim and the look before it share it."""
    states = _literal(Task, CLAIMABLE_TASK, vendor)
    claimable, n_claimable = _timed(Task, claimable_at, vendor)
    order = ", ".join(_col(Task, name) for name in CLAIM_ORDER)
    return f"WHERE {states} AND {claimable} ORDER BY {order}", n_claimable


@cache
def _claim_free_sql(vendor: str, count: int) -> tuple[str, int, int]:
    t, pk, epoch = _q(Task._meta.db_table), _col(Task, "id"), _col(Task, "lease_epoch")
    claimable, n_claimable = _claimable_in_order(vendor)
    free, n_free = _timed(Task, lease_free_at, vendor)
    skip_locked = (
        " FOR UPDATE SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    )
    until = _until_sql(vendor)
    sql = (
        f"UPDATE {t} SET {_col(Task, 'lease_owner')} = %s, {_col(Task, 'lease_until')} = {until}, "  # noqa: S608
        f"{epoch} = {epoch} + 1 WHERE {pk} IN (SELECT {pk} FROM {t} "
        f"{claimable} LIMIT {int(count)}{skip_locked}) AND {free} RETURNING {pk}, {epoch}"
    )
    return sql, n_claimable, n_free


def claim_free_tasks(owner: int, count: int, *, seconds: float) -> list[tuple[int, int]]:
    """Claim for `owner`, for `seconds` from now, up to `count` tasks claimable now
    (`models.CLAIMABLE_TASK`, `claimable_at`) in `CLAIM_ORDER` (planning tasks first, then
    least-claimed first); (task id, new epoch) of each, in no order. Now is the database's
    clock (`_now_sql`).

    Serves every worker's claim (lease.claim_many). By hand because the claim is one
    statement (DESIGN.md §4): UPDATE … WHERE id IN (SELECT … LIMIT count) AND the lease still
    free … RETURNING, so a row is claimed only if nobody holds it even when the subquery raced
    another worker, and the ORM writes no UPDATE … RETURNING. On PostgreSQL the subquery skips
    rows another claim has locked. Through the index task_claim (state, lease_epoch, id): the
    states are literals (`_literal`) so the planner descends the index once per state in
    order, with no sort of every claimable task (EXPLAIN on both databases, tests/test_sql.py).
    The count is written in too (a statement per count, a batch's few): PostgreSQL's plan
    of a prepared statement kept for every call, planned with LIMIT a parameter, guesses a
    tenth of the table and joins it whole (tests/test_sql.py reads that plan)."""
    sql, n_claimable, n_free = _claim_free_sql(connection.vendor, count)
    at, until = _now_params(connection.vendor, seconds)
    params = [owner, until, *at * n_claimable, *at * n_free]
    with _cursor(connection) as cursor:
        cursor.execute(sql, params)
        return [(int(i), int(e)) for i, e in cursor.fetchall()]


@cache
def _any_claimable_sql(vendor: str) -> tuple[str, int]:
    claimable, n_claimable = _claimable_in_order(vendor)
    return f"SELECT 1 FROM {_q(Task._meta.db_table)} {claimable} LIMIT 1", n_claimable  # noqa: S608


def any_claimable() -> bool:
    """Whether any task is claimable now (the database's clock): `Task.objects.claimable()
    .exists()`, from the same conditions as the claim (`models.CLAIMABLE_TASK`, `claimable_at`).

    Serves an idle worker's look before it claims (Worker.tick), every LOOP_IDLE_SLEEP_MS.
    By hand because the ORM compiled the look anew every time, about 1 ms against 0.1 ms to
    run it (bench/claim_latency.py times the look with the claim); through the index
    task_claim (the states as literals, and the claim's order, so no plan reads the table in
    its own order past finished tasks), so finished tasks are never read."""
    sql, n_claimable = _any_claimable_sql(connection.vendor)
    with _cursor(connection) as cursor:
        cursor.execute(sql, _now_params(connection.vendor, 0)[0] * n_claimable)
        return cursor.fetchone() is not None


@cache
def _claim_one_sql(vendor: str) -> tuple[str, int, int]:
    t, epoch, owner = _q(Task._meta.db_table), _col(Task, "lease_epoch"), _col(Task, "lease_owner")
    free, n_free = _timed(Task, lease_free_at, vendor)
    due, n_due = _timed(Task, retry_due_at, vendor)
    states = _literal(Task, CLAIMABLE_TASK, vendor)
    sql = (
        f"UPDATE {t} SET {owner} = %s, {_col(Task, 'lease_until')} = {_until_sql(vendor)}, "  # noqa: S608
        f"{epoch} = {epoch} + 1 WHERE {_col(Task, 'id')} = %s AND {states} "
        f"AND ({free} OR {owner} = %s) AND {due} RETURNING {epoch}"
    )
    return sql, n_free, n_due


def claim_one_task(task_id: int, owner: int, *, seconds: float) -> int | None:
    """Claim this task for `owner` for `seconds` if it is in a claimable state
    (`models.CLAIMABLE_TASK`), its lease is free now or already `owner`'s, and any retry is
    due (`models.claimable_at`, or held by the owner); the new epoch, or None. Now is the
    database's clock (`_now_sql`).

    Serves an API agent's `next` (lease.claim_task). By hand for the reason of
    `claim_free_tasks`: one statement that reads back the epoch it wrote (UPDATE … RETURNING).
    Through the primary key."""
    sql, n_free, n_due = _claim_one_sql(connection.vendor)
    at, until = _now_params(connection.vendor, seconds)
    params = [owner, until, task_id, *at * n_free, owner, *at * n_due]
    with _cursor(connection) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return int(row[0]) if row else None


def _db(value: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


# ---- the heartbeat (loop.worker) -------------------------------------------------------------


@cache
def _beat_sql(vendor: str, error: str) -> str:
    """error: "keep" (last_error untouched), "clear" or "set"."""
    now, w = _now_sql(vendor), _q(Worker._meta.db_table)
    # This host's time as it sent the statement, less the server's as it began it: the skew
    # (and the way there, well under a millisecond on a LAN). SQLite's clock is the host's.
    skew = (
        "%s::float8 - extract(epoch from statement_timestamp())::float8"
        if vendor == "postgresql"
        else "0.0 * %s"
    )
    sets = [f"{_col(Worker, 'last_seen')} = {now}", f"{_col(Worker, 'clock_offset')} = {skew}"]
    if error == "set":
        sets += [f"{_col(Worker, 'last_error')} = %s", f"{_col(Worker, 'last_error_at')} = {now}"]
    elif error == "clear":
        sets += [f"{_col(Worker, 'last_error')} = ''", f"{_col(Worker, 'last_error_at')} = NULL"]
    return (
        f"UPDATE {w} SET {', '.join(sets)} WHERE {_col(Worker, 'id')} = %s "  # noqa: S608
        f"AND {_col(Worker, 'state')} <> %s RETURNING {_col(Worker, 'last_seen')}"
    )


def beat(worker_id: int, *, sent: float, error: str | None) -> datetime | None:
    """The worker's heartbeat: `last_seen` is now by the database's clock, and
    `clock_offset` this host's clock (its time.time() `sent`, as it sends the statement) less
    the database's (shown on /healthz); and its error: None keeps the one recorded, "" clears
    it (a write succeeded since), else it is recorded. The time written, or None if the
    worker was found dead (its row says so).

    Serves every heartbeat (Worker.beat, every LOOP_HEARTBEAT_SECONDS). By hand because it
    reads back the time it wrote (UPDATE … RETURNING; the ORM writes none): that is the
    database's clock, which measures this host's (loop/clock.py), in the beat's one statement
    instead of a second one per beat."""
    vendor = connection.vendor
    shape = "keep" if error is None else "set" if error else "clear"
    at, _ = _now_params(vendor, 0)
    params: list[Any] = [*at, sent]
    if shape == "set":
        params += [error, *at]
    params += [worker_id, WorkerState.DEAD.value]
    with _cursor(connection) as cursor:
        cursor.execute(_beat_sql(vendor, shape), params)
        row = cursor.fetchone()
    if row is None:
        return None
    written = row[0]
    if isinstance(written, datetime):
        return written if written.tzinfo else written.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(written)).replace(tzinfo=UTC)


# ---- where a task stands in its plan (loop.open_steps) --------------------------------------


def first_open_steps(task_ids: list[int]) -> list[Step]:
    """Each task's first open step: `Step.objects.open()` (the conditions `OPEN_STEP` and
    order `OPEN_STEP_ORDER`), its first row per task, with one statement: per task, one
    descent of the partial index step_open (task, position) to its first entry.

    Serves open_steps.first_open: the tick's next step after every verdict, actions.follow,
    the dashboard's current step. By hand because the states must be written in as literals
    (`_literal`) for the partial index to serve it, so a step's cost does not grow with its
    task's history (tests/test_big_tasks.py), and the compiler's 0.2-0.8 ms is paid once."""
    if not task_ids:
        return []
    task = f"{_q(Task._meta.db_table)}.{_q(Task._meta.pk.column)}"  # type: ignore[union-attr]
    tasks, params = _among(task, task_ids)
    return load_all(Step, _first_open_where(tasks), params)


@cache
def _first_open_where(tasks: str) -> str:
    """The WHERE of the first open steps of the tasks that `tasks` (a condition on the task
    table) selects."""
    step, task = _q(Step._meta.db_table), _q(Task._meta.db_table)
    step_pk, task_pk = _q(Step._meta.pk.column), _q(Task._meta.pk.column)  # type: ignore[union-attr]
    order = ", ".join(_col(Step, name) for name in OPEN_STEP_ORDER)
    return (
        f"{step_pk} IN (SELECT (SELECT {step}.{step_pk} FROM {step} "  # noqa: S608
        f"WHERE {step}.{_col(Step, 'task')} = {task}.{task_pk} "
        f"AND {_literal(Step, OPEN_STEP, connection.vendor)} ORDER BY {order} LIMIT 1) "
        f"FROM {task} WHERE {tasks})"
    )


UNWAIVED_FAILURE = FAILED_STEP & Q(waived=False)  # a failed step that still counts


def has_unwaived_failure(task_id: int) -> bool:
    """Whether a failed step of the task still counts against it (not waived by a resume or
    a replacement). Serves actions.follow when a task has nothing left to run. By hand for
    the literal state (`_literal`): it seeks the partial index step_failed, which holds failed
    steps only, never the task's done ones."""
    sql = (
        f"SELECT 1 FROM {_q(Step._meta.db_table)} WHERE {_col(Step, 'task')} = %s "  # noqa: S608
        f"AND {_literal(Step, UNWAIVED_FAILURE, connection.vendor)} LIMIT 1"
    )
    with _cursor(connection) as cursor:
        cursor.execute(sql, [task_id])
        return cursor.fetchone() is not None


def step_counts(task_ids: list[int]) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """For each of these tasks: how many steps it has, how many are open, how many failed and
    not waived; three small statements, through the (task, position) unique index, step_open
    and step_failed. Serves the dashboard's progress (open_steps.counts). By hand for the
    literal states (`_literal`), so big tasks' done steps are never read."""
    table, task, marks = _q(Step._meta.db_table), _col(Step, "task"), _marks(task_ids)
    parts = []
    with _cursor(connection) as cursor:
        for condition in (None, OPEN_STEP, UNWAIVED_FAILURE):
            extra = f" AND {_literal(Step, condition, connection.vendor)}" if condition else ""
            cursor.execute(
                f"SELECT {task}, COUNT(*) FROM {table} "  # noqa: S608
                f"WHERE {task} IN ({marks}){extra} GROUP BY {task}",
                task_ids,
            )
            parts.append({int(t): int(n) for t, n in cursor.fetchall()})
    total, still_open, failed = parts
    return total, still_open, failed
