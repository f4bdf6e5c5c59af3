"""The ORM store's MTA-STS policies and TLS report counts."""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from django.db import transaction

from bumail_queue.models import MTASTSFailure, MTASTSPolicy, TLSReportCount
from bumail_queue.sts import STSFailure, STSMode, STSPolicy, TLSResult, TLSSessionCount

from .connection import ORMConnection, built_once

# TLS report counts per upsert: nine parameters each, well within SQLite's bound parameters.
_COUNTS_PER_STATEMENT = 100
_TLS_COUNT_COLUMNS = ("day", "domain", "policy_id", "policy", "result", "mx_host", "address", "reason", "count")
_TLS_KIND_COLUMNS = ("day", "domain", "policy_id", "result", "mx_host", "address")


class ORMSTS(ORMConnection):
    """Keeps each domain's MTA-STS policy and adds up the TLS sessions for the reports."""

    # -- MTA-STS policies and TLS report counts ----------------------------------------

    def get_sts_policy(self, domain: str) -> STSPolicy | None:
        with self.translated_errors():
            row = MTASTSPolicy.objects.using(self.alias).filter(domain=domain).first()
        if row is None:
            return None
        return STSPolicy(
            domain=row.domain,
            id=row.policy_id,
            mode=STSMode(row.mode),
            mx=tuple(row.mx),
            max_age=row.max_age,
            fetched_at=row.fetched_at,
        )

    def put_sts_policy(self, policy: STSPolicy) -> None:
        """One upsert on the domain's primary key."""
        self.validate_sts_policy(policy)
        row = MTASTSPolicy(
            domain=policy.domain,
            policy_id=policy.id,
            mode=policy.mode.value,
            mx=list(policy.mx),
            max_age=policy.max_age,
            fetched_at=policy.fetched_at,
            expires_at=policy.expires_at,
        )
        with self.translated_errors():
            MTASTSPolicy.objects.using(self.alias).bulk_create(
                [row],
                update_conflicts=True,
                unique_fields=["domain"],
                update_fields=["policy_id", "mode", "mx", "max_age", "fetched_at", "expires_at"],
            )

    def get_sts_failure(self, domain: str, policy_id: str, *, now: datetime) -> STSFailure | None:
        with self.translated_errors():
            row = (
                MTASTSFailure.objects.using(self.alias)
                .filter(domain=domain, policy_id=policy_id, until__gt=now)
                .first()
            )
        if row is None:
            return None
        return STSFailure(
            domain=row.domain,
            policy_id=row.policy_id,
            result=TLSResult(row.result),
            reason=row.reason,
            until=row.until,
        )

    def put_sts_failure(self, failure: STSFailure) -> None:
        """One upsert on the domain's primary key."""
        self.validate_sts_failure(failure)
        row = MTASTSFailure(
            domain=failure.domain,
            policy_id=failure.policy_id,
            result=failure.result.value,
            reason=failure.reason,
            until=failure.until,
        )
        with self.translated_errors():
            MTASTSFailure.objects.using(self.alias).bulk_create(
                [row],
                update_conflicts=True,
                unique_fields=["domain"],
                update_fields=["policy_id", "result", "reason", "until"],
            )

    def purge_sts(self, *, now: datetime) -> int:
        """Two deletes, each on its table's index of when a row stops mattering."""
        with self.translated_errors(), transaction.atomic(using=self.alias):
            policies, _ = MTASTSPolicy.objects.using(self.alias).filter(expires_at__lte=now).delete()
            failures, _ = MTASTSFailure.objects.using(self.alias).filter(until__lte=now).delete()
        return policies + failures

    def count_tls_sessions(self, counts: Sequence[TLSSessionCount]) -> None:
        """An ``INSERT ... ON CONFLICT DO UPDATE`` adding to each kind's row, per 100
        kinds, in one transaction."""
        self.validate_tls_counts(counts)
        merged: dict[tuple[Any, ...], TLSSessionCount] = {}
        for count in counts:  # one row per kind and statement, as ON CONFLICT requires
            known = merged.get(count.kind)
            merged[count.kind] = count if known is None else dataclasses.replace(known, count=known.count + count.count)
        rows = list(merged.values())
        if not rows:
            return
        with self._writing() as cursor:
            for start in range(0, len(rows), _COUNTS_PER_STATEMENT):
                chunk = rows[start : start + _COUNTS_PER_STATEMENT]
                params: builtins.list[Any] = []
                for row in chunk:
                    params += self._tls_count_values(row)
                cursor.execute(self._count_tls_sql(len(chunk)), params)

    def _tls_count_values(self, count: TLSSessionCount) -> builtins.list[Any]:
        connection = self.connection
        policy_field = TLSReportCount._meta.get_field("policy")
        return [
            connection.ops.adapt_datefield_value(count.day),
            count.domain,
            count.policy_id,
            policy_field.get_db_prep_save(list(count.policy), connection),
            count.result or "",
            count.mx_host,
            count.address,
            count.reason,
            count.count,
        ]

    @built_once
    def _count_tls_sql(self, rows: int) -> str:
        q, table = self.quote, self.quote(TLSReportCount._meta.db_table)
        row = "(" + ", ".join(["%s"] * len(_TLS_COUNT_COLUMNS)) + ")"
        return (
            f"INSERT INTO {table} ({', '.join(map(q, _TLS_COUNT_COLUMNS))}) VALUES {', '.join([row] * rows)} "
            f"ON CONFLICT ({', '.join(map(q, _TLS_KIND_COLUMNS))}) "
            f"DO UPDATE SET {q('count')} = {table}.{q('count')} + excluded.{q('count')}"
        )

    def tls_session_counts(self, day: date) -> builtins.list[TLSSessionCount]:
        with self.translated_errors():
            rows = list(TLSReportCount.objects.using(self.alias).filter(day=day).values(*_TLS_COUNT_COLUMNS))
        return [
            TLSSessionCount(
                day=row["day"],
                domain=row["domain"],
                policy_id=row["policy_id"],
                policy=tuple(row["policy"]),
                result=TLSResult(row["result"]) if row["result"] else None,
                mx_host=row["mx_host"],
                address=row["address"],
                reason=row["reason"],
                count=row["count"],
            )
            for row in rows
        ]

    def purge_tls_session_counts(self, *, before: date) -> int:
        with self.translated_errors():
            deleted, _ = TLSReportCount.objects.using(self.alias).filter(day__lt=before).delete()
        return deleted
