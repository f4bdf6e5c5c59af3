"""Hold and release, and bulk actions by filter: the audit of each bulk action.

A held item needs no column: its ``next_attempt_at`` is ``queries.HELD_AT``, out of
every claim's reach, so the claims' index scans are as they were.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0014_suppression_scopes"),
    ]

    operations = [
        migrations.CreateModel(
            name="BulkAction",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("acted_at", models.DateTimeField(verbose_name="acted at")),
                ("by", models.CharField(max_length=150, verbose_name="by")),
                (
                    "action",
                    models.CharField(
                        choices=[("hold", "hold"), ("release", "release"), ("cancel", "cancel"), ("retry", "retry")],
                        max_length=16,
                        verbose_name="action",
                    ),
                ),
                ("filter", models.JSONField(default=dict, verbose_name="filter")),
                ("matched", models.PositiveBigIntegerField(default=0, verbose_name="matched")),
                ("changed", models.PositiveBigIntegerField(default=0, verbose_name="changed")),
                ("skipped", models.PositiveBigIntegerField(default=0, verbose_name="skipped")),
                ("stopped", models.TextField(blank=True, default="", verbose_name="stopped")),
            ],
            options={
                "verbose_name": "bulk action",
                "verbose_name_plural": "bulk actions",
                "db_table": "bumail_queue_bulk_actions",
                "ordering": ("-acted_at", "-id"),
            },
        ),
    ]
