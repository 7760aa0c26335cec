"""PostgreSQL: a session event's run is checked by the append's fence, not by a foreign key as well.

Every record the engine appends is one statement whose ``WHERE EXISTS (SELECT 1 FROM journal_run WHERE
id = … AND epoch = … FOR SHARE)`` reads the run's row under a share lock: the run exists, and no one
can delete it (nor claim it) until the append commits. The foreign key's check then read the same row
again for every record: ~15 µs of the server's CPU and ~20 µs of a 350 µs append (measured alone on
a scratch database, 3,000 appends a round, with and without the key interleaved, rounds 2–4 of 4). The other writers of events (a run's start, a
move with its event, a fork) write them in the transaction that creates or changes the run's row.

What the constraint also did, refuse deleting a run whose events are still there, a trigger on
journal_run does now (the ORM's cascade, and so retention, deletes the events first). SQLite keeps its
constraint: its check is an index probe inside the process, and dropping it means rebuilding the table.
"""

from django.db import migrations, models

GUARD = """
CREATE OR REPLACE FUNCTION journal_run_keeps_its_session() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM journal_sessionevent WHERE run_id = OLD.id) THEN
        RAISE EXCEPTION 'run % still has session events: they are deleted first (retention does)', OLD.id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN OLD;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS journal_run_keeps_its_session ON journal_run;
CREATE TRIGGER journal_run_keeps_its_session BEFORE DELETE ON journal_run
    FOR EACH ROW EXECUTE FUNCTION journal_run_keeps_its_session();
"""

UNGUARD = """
DROP TRIGGER IF EXISTS journal_run_keeps_its_session ON journal_run;
DROP FUNCTION IF EXISTS journal_run_keeps_its_session();
"""

CONSTRAINTS = """
SELECT conname FROM pg_constraint
WHERE conrelid = 'journal_sessionevent'::regclass AND confrelid = 'journal_run'::regclass AND contype = 'f'
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CONSTRAINTS)
        names = [name for (name,) in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f"ALTER TABLE journal_sessionevent DROP CONSTRAINT {schema_editor.quote_name(name)}")
    schema_editor.execute(GUARD, params=None)  # no placeholders: "%" is PL/pgSQL format


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(UNGUARD)
    schema_editor.execute(
        "ALTER TABLE journal_sessionevent ADD CONSTRAINT journal_sessionevent_run_id_fk_journal_run_id "
        "FOREIGN KEY (run_id) REFERENCES journal_run (id) DEFERRABLE INITIALLY DEFERRED")


class Migration(migrations.Migration):
    dependencies = [("journal", "0008_search_summaries")]
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="sessionevent",
                    name="run",
                    field=models.ForeignKey(db_constraint=False, db_index=False,
                                            on_delete=models.deletion.CASCADE, related_name="events",
                                            to="journal.run"),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
