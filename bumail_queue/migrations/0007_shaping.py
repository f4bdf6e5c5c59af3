"""SHAPING's buckets: one row per destination, shared by every worker."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0006_suppression"),
    ]

    operations = [
        migrations.CreateModel(
            name="ShapingBucket",
            fields=[
                (
                    "key",
                    models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name="destination"),
                ),
                ("tokens", models.FloatField(null=True, verbose_name="tokens")),
                ("tokens_at", models.FloatField(default=0)),
                ("window_size", models.FloatField(null=True, verbose_name="slow-start window")),
                ("slots", models.JSONField(default=dict, verbose_name="slots")),
                ("suspended_until", models.FloatField(default=0)),
                ("active_at", models.FloatField(default=0)),
                ("held", models.PositiveIntegerField(default=0, verbose_name="held back")),
                ("held_until", models.FloatField(default=0)),
                ("granted", models.CharField(default="", editable=False, max_length=32)),
            ],
            options={
                "verbose_name": "shaped destination",
                "verbose_name_plural": "shaped destinations",
                "db_table": "bumail_queue_shaping",
            },
        ),
    ]
