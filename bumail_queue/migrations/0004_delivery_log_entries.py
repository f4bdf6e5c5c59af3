"""The delivery log's plural names its entries: "8 delivery log entries" under the list."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0003_delivery_log_tls"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="deliverylog",
            options={
                "ordering": ("-logged_at", "-id"),
                "verbose_name": "delivery log entry",
                "verbose_name_plural": "delivery log entries",
            },
        ),
    ]
