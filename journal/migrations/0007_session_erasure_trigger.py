"""PostgreSQL lets erasure, and only erasure, rewrite a session event: the trigger of migration 0002
now passes an UPDATE when the transaction set ``durable.erasure = 'on'`` (``allow_erasure``) AND the
update changes the payload column alone. Every other UPDATE is refused as before, and DELETE still
needs ``durable.retention = 'on'``. (SQLite relies on the ORM guard in journal.models.session.)"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION journal_sessionevent_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(current_setting('durable.retention', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' AND coalesce(current_setting('durable.erasure', true), '') = 'on' THEN
        IF NEW.id = OLD.id AND NEW.run_id = OLD.run_id AND NEW.seq = OLD.seq AND NEW.kind = OLD.kind
           AND NEW.position IS NOT DISTINCT FROM OLD.position AND NEW.step_name = OLD.step_name
           AND NEW.actor = OLD.actor AND NEW.created_at = OLD.created_at THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'the session log is append-only: erasure may rewrite only the payload of journal_sessionevent'
            USING ERRCODE = 'raise_exception';
    END IF;
    RAISE EXCEPTION 'the session log is append-only: % on journal_sessionevent is refused', TG_OP
        USING ERRCODE = 'raise_exception';
END;
$$ LANGUAGE plpgsql;
"""

# Migration 0002's function, as it was.
RESTORE = """
CREATE OR REPLACE FUNCTION journal_sessionevent_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(current_setting('durable.retention', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the session log is append-only: % on journal_sessionevent is refused', TG_OP
        USING ERRCODE = 'raise_exception';
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)  # no placeholders: "%" is PL/pgSQL format


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RESTORE, params=None)


class Migration(migrations.Migration):
    dependencies = [("journal", "0006_run_subject_erasure")]
    operations = [migrations.RunPython(forwards, backwards)]
