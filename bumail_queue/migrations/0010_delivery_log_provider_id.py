"""The delivery log keeps the ESP's message id of mail sent through a backend route,
indexed only where there is one, so that mail sent over SMTP costs the index nothing.

On PostgreSQL 11 and later the column costs next to nothing however large the table:
its constant default is written in the catalogue, not in each row.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0009_mta_sts_failures"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliverylog",
            name="provider_message_id",
            field=models.CharField(blank=True, default="", max_length=255, verbose_name="provider's message id"),
        ),
        migrations.AddIndex(
            model_name="deliverylog",
            index=models.Index(
                condition=models.Q(("provider_message_id", ""), _negated=True),
                fields=["provider_message_id"],
                name="bumail_queue_log_provider_id",
            ),
        ),
    ]
