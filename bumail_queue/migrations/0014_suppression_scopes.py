"""Suppression scopes: an address may be on the list for all mail and for channels of
its own, so its rows are keyed by ``(address, scope)`` and get an id of their own.

A primary key cannot change in place on every database, so the table is made anew
and the entries, all of the global scope, are copied into it.
"""

from __future__ import annotations

from django.db import migrations, models

_COLUMNS = "address, suppressed, reason, reply_code, reply_status, reply_text, created_at, expires_at"


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0013_inbound_mailbox"),
    ]

    operations = [
        migrations.RenameModel("Suppression", "UnscopedSuppression"),
        migrations.AlterModelTable("unscopedsuppression", "bumail_queue_suppressions_unscoped"),
        migrations.RemoveIndex("unscopedsuppression", "bumail_queue_suppr_created"),
        migrations.RemoveIndex("unscopedsuppression", "bumail_queue_suppr_expires"),
        migrations.CreateModel(
            name="Suppression",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("address", models.CharField(max_length=320, verbose_name="address")),
                ("scope", models.CharField(blank=True, default="", max_length=80, verbose_name="scope")),
                ("suppressed", models.BooleanField(default=True, verbose_name="suppressed")),
                (
                    "reason",
                    models.CharField(
                        choices=[
                            ("failed", "failed: no such mailbox or domain"),
                            ("expired", "delivery time expired twice"),
                            ("manual", "added by an operator"),
                            ("bounced", "bounced after it was handed on"),
                            ("complained", "reported as spam"),
                            ("unsubscribed", "unsubscribed"),
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
                "constraints": [
                    models.UniqueConstraint(fields=("address", "scope"), name="bumail_queue_suppr_address_scope"),
                ],
            },
        ),
        migrations.RunSQL(
            f"INSERT INTO bumail_queue_suppressions (scope, {_COLUMNS}) "
            f"SELECT '', {_COLUMNS} FROM bumail_queue_suppressions_unscoped",
            # Back to one row per address: the global entries alone.
            f"INSERT INTO bumail_queue_suppressions_unscoped ({_COLUMNS}) "
            f"SELECT {_COLUMNS} FROM bumail_queue_suppressions WHERE scope = ''",
        ),
        migrations.DeleteModel("UnscopedSuppression"),
    ]
