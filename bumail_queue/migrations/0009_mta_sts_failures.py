"""MTA-STS: when each kept policy expires, indexed, so that the expired are purged
without a scan; and the fetches that failed, kept for every worker, so that a broken
policy host is asked once per few minutes rather than once per worker or pass."""

from __future__ import annotations

import datetime
from typing import Any

from django.db import migrations, models


def _set_expiry(apps: Any, schema_editor: Any) -> None:
    policy = apps.get_model("bumail_queue", "MTASTSPolicy")
    db = schema_editor.connection.alias
    for row in policy.objects.using(db).only("domain", "fetched_at", "max_age").iterator():
        row.expires_at = row.fetched_at + datetime.timedelta(seconds=row.max_age)
        row.save(update_fields=["expires_at"])


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0008_priority_channel"),
    ]

    operations = [
        migrations.AddField(
            model_name="mtastspolicy",
            name="expires_at",
            field=models.DateTimeField(
                db_index=True,
                default=datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC),
                verbose_name="expires at",
            ),
            preserve_default=False,
        ),
        migrations.RunPython(_set_expiry, migrations.RunPython.noop, elidable=True),
        migrations.CreateModel(
            name="MTASTSFailure",
            fields=[
                ("domain", models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name="domain")),
                ("policy_id", models.CharField(max_length=32, verbose_name="policy id")),
                ("result", models.CharField(max_length=32, verbose_name="result type")),
                ("reason", models.TextField(verbose_name="reason")),
                ("until", models.DateTimeField(db_index=True, verbose_name="not fetched again until")),
            ],
            options={
                "verbose_name": "MTA-STS fetch failure",
                "verbose_name_plural": "MTA-STS fetch failures",
                "db_table": "bumail_queue_mta_sts_failures",
            },
        ),
    ]
