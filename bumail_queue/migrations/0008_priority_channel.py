"""Each item has a priority and a channel, and the claim's lanes an index; on
PostgreSQL, an enqueue has a function.

On PostgreSQL 11 and later the two columns cost next to nothing however large the
table: a column with a constant default is written in the catalogue, not in each row.
The index is built in one pass over the table, during which enqueues wait (0.2 s for
120,000 queued items, measured); a queue holds only what is not delivered yet, so
that is a small table wherever workers keep up. A plain index build, rather than a
concurrent one: that needs a migration outside a transaction, PostgreSQL only, and
a failed build leaves an invalid index behind (see docs/stores.md).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

# On PostgreSQL, an item and its message added in one call. PL/pgSQL keeps the plan of
# each statement for the session, where a statement sent as text is planned at each
# enqueue (parameters bound apart, never prepared by name, so that a pooler in
# transaction mode needs nothing of its own); that planning was a third of what an
# enqueue cost the database. The store uses it when it is there, and a statement of
# its own otherwise (a test database made without migrations).
ADD_FUNCTION = """
CREATE OR REPLACE FUNCTION bumail_queue_add(
    new_id uuid, new_key varchar, new_sender text, new_recipients jsonb, new_size bigint,
    new_created_at timestamptz, new_next_attempt_at timestamptz, new_priority smallint,
    new_channel varchar, new_data bytea
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    added uuid;
BEGIN
    INSERT INTO bumail_queue_items (id, key, sender, recipients, size, created_at, next_attempt_at,
                                    attempts, delay_notified, priority, channel, rev)
    VALUES (new_id, new_key, new_sender, new_recipients, new_size, new_created_at, new_next_attempt_at,
            0, false, new_priority, new_channel, 0)
    ON CONFLICT (key) WHERE key IS NOT NULL DO NOTHING
    RETURNING id INTO added;
    IF added IS NOT NULL THEN
        INSERT INTO bumail_queue_messages (item_id, data) VALUES (added, new_data);
        -- Wakes idle workers once the caller's transaction commits.
        PERFORM pg_notify('bumail_queue', '');
    END IF;
    RETURN added;
END
$$
"""
DROP_ADD_FUNCTION = (
    "DROP FUNCTION IF EXISTS bumail_queue_add(uuid, varchar, text, jsonb, bigint, timestamptz, timestamptz, "
    "smallint, varchar, bytea)"
)


def create_add_function(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ADD_FUNCTION)


def drop_add_function(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_ADD_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0007_shaping"),
    ]

    operations = [
        migrations.AddField(
            model_name="item",
            name="channel",
            field=models.CharField(
                db_default="default", default="default", editable=False, max_length=64, verbose_name="channel"
            ),
        ),
        migrations.AddField(
            model_name="item",
            name="priority",
            field=models.SmallIntegerField(db_default=0, default=0, editable=False, verbose_name="priority"),
        ),
        migrations.AddIndex(
            model_name="item",
            index=models.Index(
                fields=["channel", "priority", "next_attempt_at", "seq"], name="bumail_queue_items_lane"
            ),
        ),
        migrations.RunPython(create_add_function, drop_add_function),
    ]
