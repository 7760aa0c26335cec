"""journal_run keeps the indexes its queries use and no entry for a run that has nothing to find.

A run row had 20 indexes on PostgreSQL (18 on SQLite), and a run's start, claim and settle each write
an entry in every one of them there (changing the status is never a HOT update, so each new row
version is indexed anew). Seven were dead weight:

- ``agent`` had its own index and PostgreSQL's ``_like`` copy of it (for ``LIKE 'x%'``, which no query
  makes) beside ``run_agent_recent``, which leads with the agent and serves every query by agent;
- ``subject`` likewise, for a column that is empty on almost every run;
- ``parent``, ``forked_from`` and ``erasure``: full foreign-key indexes of columns that are NULL on
  almost every run (``run_parent`` already held only the runs that have a parent).

What finds a run by those columns now is a partial index of the runs that have one: ``run_parent``,
``run_forked_from``, ``run_erasure`` and ``run_subject``. A completed run's row had entries in 15
indexes on PostgreSQL (13 on SQLite) and has 8. On PostgreSQL a run's insert, claim and settle (three
autocommitted statements) took 1,028 µs with the old indexes and 957 µs with these (medians of 6
interleaved rounds of 400, two fresh databases).

The indexes go by name (Django derives them from the table and column, so every database these
migrations made has the same ones) instead of through ``AlterField``, which on SQLite copies the whole
table once per field to drop an index.
"""

from django.db import migrations, models
from django.db.models import Q

# (index, column) as 0001 and 0006 created them; "_like" ones exist on PostgreSQL only.
DROPPED = [
    ("journal_run_agent_da550b7c", "agent"),
    ("journal_run_agent_da550b7c_like", "agent"),
    ("journal_run_subject_3ea8b418", "subject"),
    ("journal_run_subject_3ea8b418_like", "subject"),
    ("journal_run_parent_id_e3e95146", "parent_id"),
    ("journal_run_forked_from_id_4079877a", "forked_from_id"),
    ("journal_run_erasure_id_4752747e", "erasure_id"),
]


def drop(apps, schema_editor):
    for name, _column in DROPPED:
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def restore(apps, schema_editor):
    postgres = schema_editor.connection.vendor == "postgresql"
    for name, column in DROPPED:
        like = name.endswith("_like")
        if like and not postgres:
            continue
        ops = " varchar_pattern_ops" if like else ""
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {schema_editor.quote_name(name)} "
                              f"ON journal_run ({schema_editor.quote_name(column)}{ops})")


class Migration(migrations.Migration):

    dependencies = [
        ("journal", "0009_session_fenced_reference"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop, restore)],
            state_operations=[
                migrations.AlterField(model_name="run", name="agent", field=models.CharField(max_length=200)),
                migrations.AlterField(
                    model_name="run", name="erasure",
                    field=models.ForeignKey(blank=True, db_index=False, null=True,
                                            on_delete=models.deletion.SET_NULL, related_name="erased_runs",
                                            to="journal.erasure")),
                migrations.AlterField(
                    model_name="run", name="forked_from",
                    field=models.ForeignKey(blank=True, db_index=False, null=True,
                                            on_delete=models.deletion.SET_NULL, related_name="forks",
                                            to="journal.run")),
                migrations.AlterField(
                    model_name="run", name="parent",
                    field=models.ForeignKey(blank=True, db_index=False, null=True,
                                            on_delete=models.deletion.SET_NULL, related_name="children",
                                            to="journal.run")),
                migrations.AlterField(model_name="run", name="subject",
                                      field=models.CharField(blank=True, default="", max_length=200)),
            ],
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=Q(forked_from__isnull=False), fields=["forked_from"], name="run_forked_from"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=Q(erasure__isnull=False), fields=["erasure"], name="run_erasure"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=~Q(subject=""), fields=["subject"], name="run_subject"),
        ),
    ]
