"""SQLite: the tables every step appends to lose AUTOINCREMENT (journal.models.keys says why).

Django rebuilds each of the four tables on SQLite (a copy, as for any change of a column there) and
does nothing on PostgreSQL, whose identity columns stay as they are.

Rebuilt from the model, journal_sessionevent would lose on SQLite the foreign key to its run that
PostgreSQL dropped in 0009 (``SessionEvent.run`` is ``db_constraint=False``). SQLite keeps it: its
check is an index probe inside the process, and it is what refuses deleting a run whose events remain
(PostgreSQL has a trigger for that; a trigger here made Django's flush fail, which deletes the tables'
rows in no set order). So the rebuild of that table on SQLite is made with the key, both ways.
"""

import copy

import journal.models.keys
from django.db import migrations


def keep_the_key(apps, schema_editor):
    """SQLite: journal_sessionevent rebuilt with its foreign key to journal_run, as before 0011."""
    if schema_editor.connection.vendor != "sqlite":
        return
    model = apps.get_model("journal", "SessionEvent")
    without = model._meta.get_field("run")
    with_key = copy.copy(without)  # the same field, bound to the same model, with its constraint
    with_key.db_constraint = True
    schema_editor.alter_field(model, without, with_key)


class Migration(migrations.Migration):

    dependencies = [
        ("journal", "0010_run_lean_indexes"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, keep_the_key),  # unapplied: the key back after the rebuilds
        *[migrations.AlterField(model_name=model, name="id",
                                field=journal.models.keys.AppendKey(primary_key=True, serialize=False))
          for model in ("checkpoint", "runstep", "sessionevent", "tracespan")],
        migrations.RunPython(keep_the_key, migrations.RunPython.noop),
    ]
