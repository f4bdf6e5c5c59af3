"""Feedback: the delivery log's ``bounced`` status and the suppression list's
``bounced``, ``complained`` and ``unsubscribed`` reasons (choices only: no column changes), and the table
of returned mail no parser could read, kept for a person."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0011_shaping_quota"),
    ]

    operations = [
        migrations.AlterField(
            model_name="deliverylog",
            name="status",
            field=models.CharField(
                choices=[
                    ("delivered", "delivered"),
                    ("deferred", "deferred"),
                    ("failed", "failed"),
                    ("expired", "expired"),
                    ("cancelled", "cancelled"),
                    ("bounced", "bounced"),
                ],
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.AlterField(
            model_name="suppression",
            name="reason",
            field=models.CharField(
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
        migrations.CreateModel(
            name="ReturnedMail",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("received_at", models.DateTimeField(verbose_name="received at")),
                ("recipients", models.TextField(blank=True, verbose_name="sent to")),
                ("sender", models.TextField(blank=True, verbose_name="from")),
                ("subject", models.TextField(blank=True, verbose_name="subject")),
                ("message", models.BinaryField(verbose_name="message")),
            ],
            options={
                "verbose_name": "unread returned mail",
                "verbose_name_plural": "unread returned mail",
                "db_table": "bumail_queue_returned_mail",
                "ordering": ("-received_at", "-id"),
                "indexes": [models.Index(fields=["received_at"], name="bumail_queue_returned_at")],
            },
        ),
    ]
