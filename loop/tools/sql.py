"""sql.execute (a side effect): one statement against a configured database, exactly once.

The target is a Django database alias (LOOP_SQL_DATABASES="name=url,…" adds them), never the
loop's own database unless LOOP_SQL_ALLOW_DEFAULT is set: a tool that can write the loop's
tables could rewrite its own journal and receipts. That is decided by identity, not by the
text of a URL: the SQLite file itself (a symlink, `./`, `../` or a hard link to the loop's file
is the loop's file), the PostgreSQL server and database, as the settings name them when a plan
is written and as the server says once connected, before any statement; and a SQLite target may
ATTACH nothing. Without `database`, the first alias listed in LOOP_SQL_DATABASES is used.

Exactly once, where the database allows (SQLite and PostgreSQL, whose DDL is transactional
too): the effect id goes into a small table `pippa_effects` in the SAME transaction as the
statement. So

- a repeat of a committed effect is refused by the primary key and answered from that row;
- everything before COMMIT is certain: a failure there rolls the statement back (an error in
  the statement is rejected, a lost connection is not sent);
- only a failed COMMIT leaves the outcome unknown, and the row is there or it is not.

So the call deduplicates itself on the effect id (`dedupes`) and is safe to repeat: a cut or a
failed COMMIT simply runs it again, and the primary key answers if it had committed (on
PostgreSQL the repeat's INSERT waits for a COMMIT still in flight, then conflicts or goes on).
No person is asked. The probe (the row, looked up) still answers for an effect recorded
uncertain before this rule.

Each call opens its own connection and closes it; the loop's connections are never used.
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    connections,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend
from django.utils import timezone

from ..outcomes import EffectNotSent, EffectRejected, EffectUncertainError
from .base import Arg, ProbeResult, ToolError, fixed, tool
from .shown import Field, json_text

log = logging.getLogger("loop.tools.sql")

TABLE = "pippa_effects"
VENDORS = {"sqlite", "postgresql"}
REJECTED = (IntegrityError, ProgrammingError, DataError, NotSupportedError)


def aliases() -> list[str]:
    """The aliases sql.execute may use, the default one first."""
    names = [alias for alias in settings.DATABASES if alias != "default"]
    if settings.LOOP_SQL_ALLOW_DEFAULT:
        names.append("default")
    return names


# ---- which database: by identity, not by name (DESIGN.md §19) --------------------------------


def _vendor(config: dict[str, Any]) -> str:
    engine = str(config.get("ENGINE", ""))
    return "sqlite" if "sqlite" in engine else "postgresql" if "postg" in engine else engine


def _file(path: str) -> tuple[Any, ...]:
    """A SQLite file by what it is: its device and inode (a symlink, `.`, `..` or a hard link
    to the same file is the same file), or its real path while it does not exist yet."""
    real = os.path.realpath(path)
    try:
        found = os.stat(real)
    except OSError:
        return ("path", real)
    return ("file", found.st_dev, found.st_ino)


def _server(host: str, port: int) -> set[Any]:
    """The addresses (or the socket folder) a PostgreSQL host names."""
    if not host or host.startswith("/"):
        return {("socket", os.path.realpath(host or "/var/run/postgresql"), port)}
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except OSError:
        return {("host", host.lower(), port)}
    return {("address", info[4][0], port) for info in infos}


def same_database(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two aliases' settings name one database, as far as they tell: SQLite by the
    file itself (`_file`), PostgreSQL by the server (any address in common, the port) and the
    database's name. `sql.execute` asks the server itself too, once connected (`_identity`)."""
    vendor = _vendor(a)
    if vendor != _vendor(b):
        return False
    if vendor == "sqlite":
        names = [str(c.get("NAME") or "") for c in (a, b)]
        if any(n in ("", ":memory:") or n.startswith("file:") for n in names):
            return names[0] == names[1]
        return _file(names[0]) == _file(names[1])
    ports = [int(str(c.get("PORT") or 5432)) for c in (a, b)]
    return (
        str(a.get("NAME")) == str(b.get("NAME"))
        and ports[0] == ports[1]
        and bool(
            _server(str(a.get("HOST") or ""), ports[0])
            & _server(str(b.get("HOST") or ""), ports[1])
        )
    )


def _identity(db: BaseDatabaseWrapper) -> tuple[Any, ...] | None:
    """The database a connection reached, as it says itself: SQLite, the main database's file
    (`_file`); PostgreSQL, the cluster's system identifier (unique to the cluster, whatever
    name, address, port or pooler reached it) and the database's name. None if it can't say."""
    with db.cursor() as cursor:
        if db.vendor == "sqlite":
            cursor.execute("PRAGMA database_list")
            path = next((str(r[2]) for r in cursor.fetchall() if r[1] == "main"), "")
            return _file(path) if path else None
        try:  # in autocommit: a refused statement leaves no transaction behind
            cursor.execute("SELECT system_identifier, current_database() FROM pg_control_system()")
        except DatabaseError:  # not allowed to read it: the server's address and port
            cursor.execute("SELECT inet_server_addr(), inet_server_port(), current_database()")
        row = cursor.fetchone()
    return ("postgresql", *row) if row and row[0] is not None else None


_own: dict[tuple[str, ...], tuple[Any, ...] | None] = {}


def _own_identity() -> tuple[Any, ...] | None:
    """`_identity` of the loop's own database (asked once per process and database)."""
    config = connections["default"].settings_dict
    key = tuple(str(config.get(k) or "") for k in ("ENGINE", "NAME", "HOST", "PORT"))
    if key not in _own:
        own = _open_config(config, "default")
        try:
            own.ensure_connection()
            _own[key] = _identity(own)
        finally:
            own.close()
    return _own[key]


def _refuse_own(db: BaseDatabaseWrapper, alias: str) -> None:
    """ToolError, before any statement, if the connection reached the loop's own database
    and LOOP_SQL_ALLOW_DEFAULT is off (the settings' look, `same_database`, missed it)."""
    if settings.LOOP_SQL_ALLOW_DEFAULT:
        return
    found = _identity(db)
    if found is not None and found == _own_identity():
        raise ToolError(
            f"'database': {alias!r} is the loop's own database under another name "
            "(the server says so); nothing was run"
        )


def _alias(args: dict[str, Any]) -> str:
    allowed = aliases()
    alias = args.get("database")
    if alias is None:
        if not allowed:
            raise ToolError("no database is configured for sql.execute (LOOP_SQL_DATABASES)")
        return allowed[0]
    if alias == "default" and alias not in allowed:
        raise ToolError(
            "'database': the loop's own database 'default' is off limits "
            "(set LOOP_SQL_ALLOW_DEFAULT=true to allow it)"
        )
    if alias not in allowed:
        raise ToolError(
            f"'database': no database {alias!r} (configured: {', '.join(allowed) or 'none'})"
        )
    if (
        alias != "default"
        and not settings.LOOP_SQL_ALLOW_DEFAULT
        and same_database(settings.DATABASES[alias], connections["default"].settings_dict)
    ):
        raise ToolError(f"'database': {alias!r} is the loop's own database under another name")
    return str(alias)


def _open(alias: str) -> BaseDatabaseWrapper:
    """A private connection for `alias` (not Django's shared one for this thread)."""
    return _open_config(settings.DATABASES[alias], alias)


def _open_config(given: dict[str, Any], alias: str) -> BaseDatabaseWrapper:
    config = dict(given)
    config.update(ATOMIC_REQUESTS=False, AUTOCOMMIT=True, CONN_MAX_AGE=0)
    for name, default in [("CONN_HEALTH_CHECKS", False), ("OPTIONS", {}), ("TIME_ZONE", None)]:
        config.setdefault(name, default)
    for name in ["NAME", "USER", "PASSWORD", "HOST", "PORT"]:
        config.setdefault(name, "")
    # Its own alias name too: this connection is ours alone, never Django's shared one.
    private = f"sql.execute:{alias}"
    wrapper: BaseDatabaseWrapper = load_backend(config["ENGINE"]).DatabaseWrapper(config, private)
    if wrapper.vendor not in VENDORS:
        raise ToolError(f"sql.execute supports SQLite and PostgreSQL, not {wrapper.vendor}")
    return wrapper


def _params(args: dict[str, Any]) -> Any:
    params = args.get("params")
    if params is not None and not isinstance(params, list | dict):
        raise ToolError("'params' must be a list or an object")
    return params


def _describe(args: dict[str, Any]) -> tuple[str, str]:
    try:
        alias = _alias(args)
    except ToolError:
        alias = str(args.get("database", "?"))
    sql = " ".join(str(args.get("sql", "")).split())
    summary = sql if len(sql) <= 160 else sql[:159] + "…"
    if args.get("params") is not None:
        summary += f" with {args['params']!r}"[:200]
    return f"database {alias}", summary


def _show(args: dict[str, Any]) -> list[Field]:
    """The database it runs on, the statement as written and its parameters."""
    try:
        database = _alias(args)
    except ToolError as exc:
        database = f"{args.get('database', '(none given)')} — {exc}"
    fields = [Field("Database", str(database)), Field("SQL", str(args.get("sql", "")), "code")]
    if args.get("params") is not None:
        fields.append(Field("Parameters", json_text(args["params"]), "json"))
    return fields


def _check(args: dict[str, Any]) -> list[str]:
    problems = []
    if fixed(args.get("database")):
        try:
            _alias(args)
        except ToolError as exc:
            problems.append("args.database: " + str(exc).removeprefix("'database': "))
    if fixed(args["sql"]) and not args["sql"].strip():
        problems.append("args.sql: empty")
    if fixed(args.get("params")):
        try:
            _params(args)
        except ToolError as exc:
            problems.append("args.params: " + str(exc).removeprefix("'params' "))
    return problems


@tool(
    "sql.execute",
    args={
        "database": Arg("string", required=False),
        "sql": Arg("string"),
        "params": Arg("any", required=False),
    },
    side_effect=True,
    describe=lambda args: _describe(args),
    show=lambda args: _show(args),
    probe=lambda args, effect_id: _probe(args, effect_id),
    dedupes=lambda args: True,  # the target's pippa_effects answers a repeat
    check=_check,
)
def sql_execute(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
    alias = _alias(args)
    params = _params(args)
    db = _open(alias)
    try:
        try:
            db.ensure_connection()
            if db.vendor == "sqlite":
                # No ATTACH: a statement could open the loop's own file beside the target's.
                db.connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            _refuse_own(db, alias)
            with db.cursor() as cursor:  # autocommit: a table made once stays made
                cursor.execute(
                    f"CREATE TABLE IF NOT EXISTS {TABLE} ("  # noqa: S608 - a constant name
                    "effect_id VARCHAR(64) PRIMARY KEY, at VARCHAR(40) NOT NULL, rowcount INTEGER)"
                )
        except REJECTED as exc:
            raise EffectRejected(f"database {alias}: can't keep {TABLE}: {exc}") from exc
        except DatabaseError as exc:
            raise EffectNotSent(f"database {alias}: {exc}") from exc
        try:
            db.set_autocommit(False)
            with db.cursor() as cursor:
                try:
                    cursor.execute(
                        f"INSERT INTO {TABLE} (effect_id, at) VALUES (%s, %s)",  # noqa: S608
                        [effect_id, timezone.now().isoformat()],
                    )
                except IntegrityError:
                    db.rollback()
                    return _repeat(db, alias, effect_id)
                cursor.execute(args["sql"], params)
                rowcount = cursor.rowcount
                cursor.execute(
                    f"UPDATE {TABLE} SET rowcount = %s WHERE effect_id = %s",  # noqa: S608
                    [rowcount, effect_id],
                )
        except DatabaseError as exc:  # before COMMIT: rolled back, so it did not happen
            _rollback(db)
            if _statement_error(db, exc):
                raise EffectRejected(f"database {alias}: {exc}") from exc
            raise EffectNotSent(f"database {alias}: {exc} (rolled back)") from exc
        try:
            db.commit()
        except Exception as exc:
            raise EffectUncertainError(f"database {alias}: COMMIT failed: {exc}") from exc
        return {"rowcount": rowcount}
    finally:
        try:
            db.close()
        except DatabaseError:
            log.warning("closing database %s failed", alias, exc_info=True)


def _statement_error(db: BaseDatabaseWrapper, exc: DatabaseError) -> bool:
    """The statement itself is wrong (it would fail again): rejected, not retried. SQLite
    reports syntax errors and unknown tables as OperationalError, beside "database is locked"."""
    if isinstance(exc, REJECTED):
        return True
    if db.vendor == "sqlite" and isinstance(exc, OperationalError):
        transient = ("locked", "busy", "disk", "full", "unable to open", "interrupted")
        return not any(word in str(exc).lower() for word in transient)
    return False


def _rollback(db: BaseDatabaseWrapper) -> None:
    try:
        db.rollback()
    except DatabaseError:
        log.warning("rollback failed; closing the connection rolls back", exc_info=True)


def _repeat(db: BaseDatabaseWrapper, alias: str, effect_id: str) -> dict[str, Any]:
    """The effect committed before (its outcome was lost): refuse to run it again."""
    with db.cursor() as cursor:
        cursor.execute(
            f"SELECT rowcount FROM {TABLE} WHERE effect_id = %s",  # noqa: S608
            [effect_id],
        )
        row = cursor.fetchone()
    log.warning("sql.execute %s: effect %s had already committed; not run again", alias, effect_id)
    return {"rowcount": row[0] if row else None}


def _probe(args: dict[str, Any], effect_id: str) -> ProbeResult:
    """Is this effect's row in the target's pippa_effects? A definite answer either way."""
    alias = _alias(args)
    db = _open(alias)
    try:
        with db.cursor() as cursor:
            cursor.execute(
                f"SELECT rowcount, at FROM {TABLE} WHERE effect_id = %s",  # noqa: S608
                [effect_id],
            )
            row = cursor.fetchone()
    except DatabaseError as exc:
        if _table_missing(db):
            return ProbeResult(False, f"database {alias} has no {TABLE}: nothing was committed")
        return ProbeResult(None, f"database {alias} could not be asked: {exc}")
    finally:
        db.close()
    if row is None:
        return ProbeResult(
            False, f"no row for this effect in {TABLE} of {alias}: the statement did not commit"
        )
    return ProbeResult(
        True, f"{TABLE} of {alias} has this effect, committed {row[1]}", {"rowcount": row[0]}
    )


def _table_missing(db: BaseDatabaseWrapper) -> bool:
    try:
        db.close()
        with db.cursor() as cursor:
            return TABLE not in db.introspection.table_names(cursor)
    except DatabaseError:
        return False
