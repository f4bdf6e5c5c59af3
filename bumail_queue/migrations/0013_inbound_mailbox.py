"""Fetching returned mail from a mailbox (``queue_inbound --imap``/``--pop3``): the
messages in flight, so that none is processed twice across a crash, and the note of
unread returned mail that says why a message was kept."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0012_feedback"),
    ]

    operations = [
        migrations.AddField(
            model_name="returnedmail",
            name="note",
            field=models.TextField(blank=True, default="", verbose_name="note"),
        ),
        migrations.CreateModel(
            name="MailboxMessage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("mailbox", models.CharField(max_length=500, verbose_name="mailbox")),
                ("digest", models.CharField(max_length=64, verbose_name="digest")),
                (
                    "state",
                    models.CharField(
                        choices=[("started", "started"), ("done", "done")], max_length=16, verbose_name="state"
                    ),
                ),
                ("fetched_at", models.DateTimeField(verbose_name="fetched at")),
            ],
            options={
                "verbose_name": "message fetched from a mailbox",
                "verbose_name_plural": "messages fetched from a mailbox",
                "db_table": "bumail_queue_mailbox_message",
                "constraints": [
                    models.UniqueConstraint(fields=("mailbox", "digest"), name="bumail_queue_mailbox_message_once")
                ],
            },
        ),
    ]
