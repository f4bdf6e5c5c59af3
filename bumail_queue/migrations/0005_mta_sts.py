"""MTA-STS: the policies kept for every worker, and the TLS report counts (RFC 8461, RFC 8460)."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bumail_queue", "0004_delivery_log_entries"),
    ]

    operations = [
        migrations.CreateModel(
            name="MTASTSPolicy",
            fields=[
                ("domain", models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name="domain")),
                ("policy_id", models.CharField(max_length=32, verbose_name="policy id")),
                ("mode", models.CharField(max_length=16, verbose_name="mode")),
                ("mx", models.JSONField(default=list, verbose_name="mx patterns")),
                ("max_age", models.PositiveIntegerField(verbose_name="max age")),
                ("fetched_at", models.DateTimeField(verbose_name="fetched at")),
            ],
            options={
                "verbose_name": "MTA-STS policy",
                "verbose_name_plural": "MTA-STS policies",
                "db_table": "bumail_queue_mta_sts_policies",
            },
        ),
        migrations.CreateModel(
            name="TLSReportCount",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("day", models.DateField(verbose_name="day")),
                ("domain", models.CharField(max_length=255, verbose_name="policy domain")),
                ("policy_id", models.CharField(blank=True, max_length=32, verbose_name="policy id")),
                ("policy", models.JSONField(default=list, verbose_name="policy")),
                ("result", models.CharField(blank=True, max_length=32, verbose_name="result type")),
                ("mx_host", models.CharField(blank=True, max_length=255, verbose_name="MX host")),
                ("address", models.CharField(blank=True, max_length=45, verbose_name="address")),
                ("reason", models.TextField(blank=True, verbose_name="reason")),
                ("count", models.PositiveBigIntegerField(default=0, verbose_name="sessions")),
            ],
            options={
                "verbose_name": "TLS report count",
                "verbose_name_plural": "TLS report counts",
                "db_table": "bumail_queue_tls_report_counts",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("day", "domain", "policy_id", "result", "mx_host", "address"),
                        name="bumail_queue_tls_kind",
                    )
                ],
            },
        ),
    ]
