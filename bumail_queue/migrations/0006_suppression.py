"""The ORM store's suppression list: addresses that fail at once until their entries expire."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0005_mta_sts"),
    ]

    operations = [
        migrations.CreateModel(
            name="Suppression",
            fields=[
                (
                    "address",
                    models.CharField(max_length=320, primary_key=True, serialize=False, verbose_name="address"),
                ),
                ("suppressed", models.BooleanField(default=True, verbose_name="suppressed")),
                (
                    "reason",
                    models.CharField(
                        choices=[
                            ("failed", "failed: no such mailbox or domain"),
                            ("expired", "delivery time expired twice"),
                            ("manual", "added by an operator"),
                        ],
                        max_length=16,
                        verbose_name="reason",
                    ),
                ),
                ("reply_code", models.PositiveSmallIntegerField(blank=True, null=True, verbose_name="reply code")),
                ("reply_status", models.CharField(blank=True, max_length=16, verbose_name="enhanced status")),
                ("reply_text", models.TextField(blank=True, verbose_name="reply")),
                ("created_at", models.DateTimeField(verbose_name="suppressed at")),
                ("expires_at", models.DateTimeField(verbose_name="expires at")),
            ],
            options={
                "verbose_name": "suppressed address",
                "verbose_name_plural": "suppressed addresses",
                "db_table": "bumail_queue_suppressions",
                "ordering": ("-created_at", "-address"),
                "indexes": [
                    models.Index(fields=["created_at"], name="bumail_queue_suppr_created"),
                    models.Index(fields=["expires_at"], name="bumail_queue_suppr_expires"),
                ],
            },
        ),
    ]
