"""The archive of delivered messages (``ARCHIVE``), the links of resent items to what
they resend, and the subject and Message-ID of each delivery log entry."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0015_hold"),
    ]

    operations = [
        migrations.CreateModel(
            name="ResentMessage",
            fields=[
                ("item_id", models.UUIDField(primary_key=True, serialize=False, verbose_name="item id")),
                ("resent_from", models.UUIDField(db_index=True, verbose_name="resent from")),
                ("resent_at", models.DateTimeField(verbose_name="resent at")),
                ("by", models.CharField(blank=True, max_length=150, verbose_name="by")),
            ],
            options={
                "verbose_name": "resent message",
                "verbose_name_plural": "resent messages",
                "db_table": "bumail_queue_resent",
                "ordering": ("-resent_at", "-item_id"),
            },
        ),
        migrations.AddField(
            model_name="deliverylog",
            name="message_id",
            field=models.TextField(blank=True, default="", verbose_name="Message-ID"),
        ),
        migrations.AddField(
            model_name="deliverylog",
            name="subject",
            field=models.TextField(blank=True, default="", verbose_name="subject"),
        ),
        migrations.CreateModel(
            name="ArchivedMessage",
            fields=[
                ("item_id", models.UUIDField(primary_key=True, serialize=False, verbose_name="item id")),
                ("archived_at", models.DateTimeField(verbose_name="archived at")),
                ("channel", models.CharField(default="default", max_length=64, verbose_name="channel")),
                ("priority", models.SmallIntegerField(default=0, verbose_name="priority")),
                ("sender", models.TextField(blank=True, verbose_name="sender")),
                ("recipients", models.TextField(blank=True, verbose_name="recipients")),
                ("subject", models.TextField(blank=True, verbose_name="subject")),
                ("message_id", models.TextField(blank=True, verbose_name="Message-ID")),
                ("headers", models.BinaryField(verbose_name="headers")),
                ("data", models.BinaryField(null=True, verbose_name="message")),
                ("body_until", models.DateTimeField(verbose_name="message kept until")),
                ("keep_until", models.DateTimeField(verbose_name="headers kept until")),
                ("resent_from", models.UUIDField(blank=True, null=True, verbose_name="resent from")),
            ],
            options={
                "verbose_name": "archived message",
                "verbose_name_plural": "archived messages",
                "db_table": "bumail_queue_archive",
                "ordering": ("-archived_at", "-item_id"),
                "indexes": [
                    models.Index(fields=["archived_at"], name="bumail_queue_archive_at"),
                    models.Index(fields=["body_until"], name="bumail_queue_archive_body"),
                    models.Index(fields=["keep_until"], name="bumail_queue_archive_keep"),
                ],
            },
        ),
    ]
