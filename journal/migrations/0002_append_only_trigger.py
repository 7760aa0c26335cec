"""PostgreSQL enforces the append-only session log itself: UPDATE and DELETE on
journal_sessionevent are refused unless retention set ``durable.retention = 'on'`` for its
transaction. (SQLite relies on the ORM guard in journal.models.session.)"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION journal_sessionevent_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(current_setting('durable.retention', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the session log is append-only: % on journal_sessionevent is refused', TG_OP
        USING ERRCODE = 'raise_exception';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS journal_sessionevent_append_only ON journal_sessionevent;
CREATE TRIGGER journal_sessionevent_append_only BEFORE UPDATE OR DELETE ON journal_sessionevent
    FOR EACH ROW EXECUTE FUNCTION journal_sessionevent_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS journal_sessionevent_append_only ON journal_sessionevent;
DROP FUNCTION IF EXISTS journal_sessionevent_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)  # no placeholders: "%" is PL/pgSQL format


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("journal", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
