from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0002_delivery_log"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliverylog",
            name="tls",
            field=models.BooleanField(default=False, verbose_name="TLS"),
        ),
    ]
