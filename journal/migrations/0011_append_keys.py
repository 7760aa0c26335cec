"""SQLite: the tables every step appends to lose AUTOINCREMENT (journal.models.keys says why).

Django rebuilds each of the four tables on SQLite (a copy, as for any change of a column there) and
does nothing on PostgreSQL, whose identity columns stay as they are.

Rebuilt from the model, journal_sessionevent loses on SQLite the foreign key to its run that
PostgreSQL lost in 0009 (``SessionEvent.run`` is ``db_constraint=False``), and SQLite now checks a
record's run as PostgreSQL does: by the append's fence, whose ``EXISTS`` reads the run's row inside
the database's one write lock, so no one deletes the run before the record commits. What the key
also did, refuse deleting a run whose events remain, a trigger on journal_run does here too
(``tests/test_append_only.py`` holds both databases to it, so a later rebuild of journal_run that
dropped the trigger would fail there). The trigger names journal_sessionevent, so SQLite refuses to
rename a rebuilt copy of that table into place while it exists: this migration takes it away before
its rebuilds and puts it back after them, both ways, and a later rebuild of the table must do the same.
"""

import journal.models.keys
from django.db import migrations

GUARD = """
CREATE TRIGGER IF NOT EXISTS journal_run_keeps_its_session BEFORE DELETE ON journal_run
FOR EACH ROW WHEN EXISTS (SELECT 1 FROM journal_sessionevent WHERE run_id = OLD.id)
BEGIN
    SELECT RAISE(ABORT, 'the run still has session events: they are deleted first (retention does)');
END
"""


def guard(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":  # PostgreSQL's is 0009's
        schema_editor.execute(GUARD)


def unguard(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS journal_run_keeps_its_session")


class Migration(migrations.Migration):

    dependencies = [
        ("journal", "0010_run_lean_indexes"),
    ]

    operations = [
        migrations.RunPython(unguard, guard),  # unapplied: the trigger comes back once the tables are rebuilt
        *[migrations.AlterField(model_name=model, name="id",
                                field=journal.models.keys.AppendKey(primary_key=True, serialize=False))
          for model in ("checkpoint", "runstep", "sessionevent", "tracespan")],
        migrations.RunPython(guard, unguard),
    ]
