"""A shaping bucket keeps a ``QUOTA``'s count: its bins, their window, and when the
newest leaves it. The shaping table holds one row per destination, so the new columns
cost nothing worth measuring on any database."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0010_delivery_log_provider_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="shapingbucket",
            name="quota_bins",
            field=models.JSONField(default=dict, verbose_name="quota's count"),
        ),
        migrations.AddField(
            model_name="shapingbucket",
            name="quota_period",
            field=models.FloatField(default=0),
        ),
        migrations.AddField(
            model_name="shapingbucket",
            name="quota_until",
            field=models.FloatField(default=0),
        ),
    ]
