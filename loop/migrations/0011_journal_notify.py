"""On PostgreSQL, every statement that appends to the journal notifies `loop_journal`
(`journal.NOTIFY_CHANNEL`), delivered when its transaction commits (one notice per
transaction, PostgreSQL folding the same payload): the live tailers wait for it instead of
polling the journal (loop/web/live.py). A trigger, so no writer pays a round trip for it.
Nothing on SQLite, where the tailer polls its file."""

from django.db import migrations

CHANNEL = "loop_journal"  # journal.NOTIFY_CHANNEL (a migration keeps its own copy)


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("loop", "Event")._meta.db_table)
    schema_editor.execute(
        "CREATE OR REPLACE FUNCTION loop_journal_notify() RETURNS trigger AS $$ "
        f"BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$ LANGUAGE plpgsql"
    )
    schema_editor.execute(
        f"CREATE TRIGGER loop_journal_notify AFTER INSERT ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION loop_journal_notify()"
    )


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("loop", "Event")._meta.db_table)
    schema_editor.execute(f"DROP TRIGGER IF EXISTS loop_journal_notify ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS loop_journal_notify()")


class Migration(migrations.Migration):
    dependencies = [("loop", "0010_model_judge")]

    operations = [migrations.RunPython(create, drop)]
