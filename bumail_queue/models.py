"""The ORM store's tables: ``bumail_queue_items`` and ``bumail_queue_messages``.

Read and change them through ``bumail_queue.queue`` (or a ``QueueStore``), never by
raw updates: those would bypass the leases that keep two workers off one item.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _

from .items import CHANNEL_MAX_LENGTH, DEFAULT_CHANNEL, DEFAULT_PRIORITY, QueueItem, Recipient, Reply, reply_line


class Item(models.Model):
    """An item in the queue: one message, its envelope, each recipient's state."""

    # ``seq`` orders items equally due (oldest first); ``id`` is the public handle.
    seq = models.BigAutoField(primary_key=True)
    id = models.UUIDField(_("id"), unique=True, editable=False)
    # NULL rather than "" where there is no key or no lease: keyless items stay out of
    # the unique index on key, and the claim tests "lease_owner IS NULL".
    key = models.CharField(_("idempotency key"), max_length=255, null=True, blank=True, editable=False)
    sender = models.TextField(_("sender"), blank=True)
    recipients = models.JSONField(_("recipients"), default=list)
    size = models.PositiveBigIntegerField(_("size"))
    created_at = models.DateTimeField(_("created at"))
    next_attempt_at = models.DateTimeField(_("next attempt at"))
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    delay_notified = models.BooleanField(_("delay notified"), default=False)
    lease_owner = models.CharField(_("lease owner"), max_length=255, null=True, blank=True)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    # Bumped by every recorded outcome, so a worker whose read went stale retries.
    rev = models.PositiveIntegerField(default=0, editable=False)
    # -100 to 100, higher claimed first (items.check_priority); channels take turns.
    # The database keeps the defaults too, so that a process still running the code of
    # before these columns (a rolling upgrade) adds rows that have them.
    priority = models.SmallIntegerField(
        _("priority"), default=DEFAULT_PRIORITY, db_default=DEFAULT_PRIORITY, editable=False
    )
    channel = models.CharField(
        _("channel"), max_length=CHANNEL_MAX_LENGTH, default=DEFAULT_CHANNEL, db_default=DEFAULT_CHANNEL, editable=False
    )

    class Meta:
        db_table = "bumail_queue_items"
        verbose_name = _("queued item")
        verbose_name_plural = _("queued items")
        ordering = ("next_attempt_at", "seq")
        constraints = (
            # Partial: only items with a key pay for this index on enqueue.
            models.UniqueConstraint(
                fields=("key",), condition=models.Q(key__isnull=False), name="bumail_queue_items_key"
            ),
        )
        indexes = (
            # Serves the claim: the earliest due, then the oldest. A claim moves an
            # item's next_attempt_at to its lease's expiry, so leased items leave the
            # front of this index and a backlog of leases never slows the claim.
            models.Index(fields=("next_attempt_at", "seq"), name="bumail_queue_items_due"),
            # Serves the claim's lanes: a channel's items of one priority, due first.
            # The claim finds the lanes by skipping through this index (one probe per
            # lane) and reads the front of each, so a lane's items not due yet (the
            # retries, the mail sent with at=) never stand between it and the next.
            models.Index(fields=("channel", "priority", "next_attempt_at", "seq"), name="bumail_queue_items_lane"),
        )

    def __str__(self) -> str:
        return str(self.id)

    def to_queue_item(self) -> QueueItem:
        """Return the store-neutral ``QueueItem`` of this row."""
        return item_from_row(self.__dict__)


class Message(models.Model):
    """The message of an item, byte for byte as enqueued; dropped with its item."""

    item = models.OneToOneField(
        Item,
        on_delete=models.CASCADE,
        primary_key=True,
        to_field="id",
        db_column="item_id",
        related_name="message",
        # The store drops a message with its item in the same transaction; a database
        # constraint would only add a check to every enqueue.
        db_constraint=False,
    )
    data = models.BinaryField(_("data"))

    class Meta:
        db_table = "bumail_queue_messages"
        verbose_name = _("queued message")
        verbose_name_plural = _("queued messages")

    def __str__(self) -> str:
        return str(self.item_id)


def item_from_row(row: dict[str, Any]) -> QueueItem:
    """Build a ``QueueItem`` from a row's column values (model ``__dict__`` or a raw row)."""
    recipients = row["recipients"]
    return QueueItem(
        id=str(row["id"]),
        sender=row["sender"],
        recipients=[Recipient.from_dict(r) for r in recipients],
        size=row["size"],
        created_at=row["created_at"],
        next_attempt_at=row["next_attempt_at"],
        attempts=row["attempts"],
        delay_notified=bool(row["delay_notified"]),
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        key=row["key"],
        priority=row["priority"],
        channel=row["channel"],
    )


class DeliveryLog(models.Model):
    """One recipient's outcome, kept after its item has left the queue.

    Written by the worker's outcome signals and by ``queue.cancel``, whatever store
    keeps the queue; deleted by age with ``manage.py queue_purge``. See
    ``docs/delivery-log.md``.
    """

    class Status(models.TextChoices):
        DELIVERED = "delivered", _("delivered")
        DEFERRED = "deferred", _("deferred")
        FAILED = "failed", _("failed")
        EXPIRED = "expired", _("expired")
        CANCELLED = "cancelled", _("cancelled")
        BOUNCED = "bounced", _("bounced")

    id = models.BigAutoField(primary_key=True)
    logged_at = models.DateTimeField(_("logged at"))
    item_id = models.UUIDField(_("item id"))
    recipient = models.TextField(_("recipient"))
    # Lowercased, for the admin's filter: the part after the address's last "@".
    domain = models.CharField(_("domain"), max_length=255, blank=True)
    sender = models.TextField(_("sender"), blank=True)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices)
    reply_code = models.PositiveSmallIntegerField(_("reply code"), null=True, blank=True)
    reply_status = models.CharField(_("enhanced status"), max_length=16, blank=True)
    reply_text = models.TextField(_("reply"), blank=True)
    remote_host = models.CharField(_("remote host"), max_length=255, blank=True)
    # Whether the session with remote_host ran over TLS (STARTTLS or implicit).
    tls = models.BooleanField(_("TLS"), default=False)
    next_attempt_at = models.DateTimeField(_("next attempt at"), null=True, blank=True)
    # The ESP's id for the message, from a backend route (anymail's message_id): what
    # its later events (a bounce, a complaint) name it by.
    provider_message_id = models.CharField(_("provider's message id"), max_length=255, blank=True, default="")
    # The message's Subject and Message-ID, so that an entry says which mail it was.
    subject = models.TextField(_("subject"), blank=True, default="")
    message_id = models.TextField(_("Message-ID"), blank=True, default="")

    class Meta:
        db_table = "bumail_queue_delivery_log"
        verbose_name = _("delivery log entry")
        # "8 delivery log entries" under the list, and in the admin's navigation.
        verbose_name_plural = _("delivery log entries")
        ordering = ("-logged_at", "-id")
        indexes = (
            # The newest first (the admin's list), and the purge by age.
            models.Index(fields=("logged_at",), name="bumail_queue_log_logged_at"),
            # "What happened to this item?" (the item page's history).
            models.Index(fields=("item_id", "logged_at"), name="bumail_queue_log_item"),
            # "What happened to my mail to X?"
            models.Index(fields=("recipient", "logged_at"), name="bumail_queue_log_recipient"),
            # An ESP's event, matched to the entry of the message it names; only the
            # entries of backend routes have one, so only they are in the index.
            models.Index(
                fields=("provider_message_id",),
                name="bumail_queue_log_provider_id",
                condition=~models.Q(provider_message_id=""),
            ),
        )

    def __str__(self) -> str:
        return f"{self.recipient} {self.status} ({self.item_id})"

    @property
    def reply_line(self) -> str:
        """Return the reply as one line: ``550 5.1.1 No such user`` (``items.reply_line``)."""
        return reply_line(Reply(code=self.reply_code, status=self.reply_status, text=self.reply_text))


class MTASTSPolicy(models.Model):
    """A recipient domain's MTA-STS policy (RFC 8461), as last fetched: the ORM store
    keeps it for every worker until its domain announces another (``docs/mta-sts.md``)."""

    # Lowercase A-labels, as routes compare domains.
    domain = models.CharField(_("domain"), max_length=255, primary_key=True)
    # The id of the _mta-sts TXT record the policy was fetched for.
    policy_id = models.CharField(_("policy id"), max_length=32)
    mode = models.CharField(_("mode"), max_length=16)
    mx = models.JSONField(_("mx patterns"), default=list)
    max_age = models.PositiveIntegerField(_("max age"))
    fetched_at = models.DateTimeField(_("fetched at"))
    # fetched_at + max_age, kept so that the expired are found by an index, not a scan.
    expires_at = models.DateTimeField(_("expires at"), db_index=True)

    class Meta:
        db_table = "bumail_queue_mta_sts_policies"
        verbose_name = _("MTA-STS policy")
        verbose_name_plural = _("MTA-STS policies")

    def __str__(self) -> str:
        return f"{self.domain} ({self.mode}, id {self.policy_id})"


class MTASTSFailure(models.Model):
    """A recipient domain's MTA-STS policy that could not be fetched: no worker fetches
    that policy id again before ``until`` (``docs/mta-sts.md``)."""

    domain = models.CharField(_("domain"), max_length=255, primary_key=True)
    policy_id = models.CharField(_("policy id"), max_length=32)
    result = models.CharField(_("result type"), max_length=32)
    reason = models.TextField(_("reason"))
    until = models.DateTimeField(_("not fetched again until"), db_index=True)

    class Meta:
        db_table = "bumail_queue_mta_sts_failures"
        verbose_name = _("MTA-STS fetch failure")
        verbose_name_plural = _("MTA-STS fetch failures")

    def __str__(self) -> str:
        return f"{self.domain} (id {self.policy_id}, {self.result})"


class TLSReportCount(models.Model):
    """How many TLS sessions of a day to a policy domain ended one way (RFC 8460): the
    rows ``manage.py queue_tlsrpt`` makes a day's reports of (``docs/mta-sts.md``)."""

    id = models.BigAutoField(primary_key=True)
    day = models.DateField(_("day"))
    domain = models.CharField(_("policy domain"), max_length=255)
    policy_id = models.CharField(_("policy id"), max_length=32, blank=True)
    # The policy's lines (RFC 8460's policy-string); empty when none could be had.
    policy = models.JSONField(_("policy"), default=list)
    # An RFC 8460 result type; "" counts the successful sessions.
    result = models.CharField(_("result type"), max_length=32, blank=True)
    mx_host = models.CharField(_("MX host"), max_length=255, blank=True)
    address = models.CharField(_("address"), max_length=45, blank=True)
    reason = models.TextField(_("reason"), blank=True)
    count = models.PositiveBigIntegerField(_("sessions"), default=0)

    class Meta:
        db_table = "bumail_queue_tls_report_counts"
        verbose_name = _("TLS report count")
        verbose_name_plural = _("TLS report counts")
        constraints = (
            # One row per kind, which an upsert adds to; it leads with the day, so it
            # also serves a day's report and the purge of old days.
            models.UniqueConstraint(
                fields=("day", "domain", "policy_id", "result", "mx_host", "address"), name="bumail_queue_tls_kind"
            ),
        )

    def __str__(self) -> str:
        return f"{self.day} {self.domain} {self.result or 'successful'}: {self.count}"


class Suppression(models.Model):
    """An address of the suppression list, kept by the ORM store; see ``docs/suppression.md``.

    ``suppressed`` is false for a note of a first expiry (``MAX_AGE``), which becomes
    an entry when a second comes before ``expires_at``. Read and change the list
    through ``bumail_queue.queue`` (``suppressed``, ``suppress``, ``unsuppress``).
    """

    class Reason(models.TextChoices):
        FAILED = "failed", _("failed: no such mailbox or domain")
        EXPIRED = "expired", _("delivery time expired twice")
        MANUAL = "manual", _("added by an operator")
        BOUNCED = "bounced", _("bounced after it was handed on")
        COMPLAINED = "complained", _("reported as spam")
        UNSUBSCRIBED = "unsubscribed", _("unsubscribed")

    id = models.BigAutoField(primary_key=True)
    # The local part as written, the domain in lowercase A-labels (addresses.normal_address).
    address = models.CharField(_("address"), max_length=320)
    # "" for all mail, "channel:<name>" for one channel's (suppression.channel_scope).
    scope = models.CharField(_("scope"), max_length=80, blank=True, default="")
    suppressed = models.BooleanField(_("suppressed"), default=True)
    reason = models.CharField(_("reason"), max_length=16, choices=Reason.choices)
    reply_code = models.PositiveSmallIntegerField(_("reply code"), null=True, blank=True)
    reply_status = models.CharField(_("enhanced status"), max_length=16, blank=True)
    reply_text = models.TextField(_("reply"), blank=True)
    created_at = models.DateTimeField(_("suppressed at"))
    expires_at = models.DateTimeField(_("expires at"))

    class Meta:
        db_table = "bumail_queue_suppressions"
        verbose_name = _("suppressed address")
        verbose_name_plural = _("suppressed addresses")
        ordering = ("-created_at", "-address")
        constraints = (
            # An address's entry per scope: lookups and upserts go by it.
            models.UniqueConstraint(fields=("address", "scope"), name="bumail_queue_suppr_address_scope"),
        )
        indexes = (
            # The newest first (the admin's list).
            models.Index(fields=("created_at",), name="bumail_queue_suppr_created"),
            # The purge of what expired.
            models.Index(fields=("expires_at",), name="bumail_queue_suppr_expires"),
        )

    def __str__(self) -> str:
        return self.address


class ShapingBucket(models.Model):
    """One destination's shaping state (``SHAPING``), shared by every worker.

    Times are seconds since the epoch, as the store's one-statement arithmetic wants
    them; ``slots`` maps each slot held to its lease's end. Read it through
    ``QueueStore.destination_states()``: the store's statements are its only writers.
    """

    key = models.CharField(_("destination"), max_length=255, primary_key=True)
    tokens = models.FloatField(_("tokens"), null=True)  # NULL: full (or no RATE)
    tokens_at = models.FloatField(default=0)
    window_size = models.FloatField(_("slow-start window"), null=True)
    slots = models.JSONField(_("slots"), default=dict)
    suspended_until = models.FloatField(default=0)
    active_at = models.FloatField(default=0)
    held = models.PositiveIntegerField(_("held back"), default=0)
    held_until = models.FloatField(default=0)
    # A QUOTA's count: bin start -> what was sent while it was the newest; the window
    # they were counted for; when the newest leaves it (the bucket is not idle before).
    quota_bins = models.JSONField(_("quota's count"), default=dict)
    quota_period = models.FloatField(default=0)
    quota_until = models.FloatField(default=0)
    # The last request granted: a statement that decides in one step returns it, so the
    # caller knows whether its own request was the one.
    granted = models.CharField(max_length=32, default="", editable=False)

    class Meta:
        db_table = "bumail_queue_shaping"
        verbose_name = _("shaped destination")
        verbose_name_plural = _("shaped destinations")

    def __str__(self) -> str:
        return self.key


class ReturnedMail(models.Model):
    """Mail that came back (``queue_inbound``) and that no parser could read, or whose
    processing a pass over a mailbox left unfinished (``note`` says so): kept for a
    person, never dropped. See ``docs/feedback.md``."""

    id = models.BigAutoField(primary_key=True)
    received_at = models.DateTimeField(_("received at"))
    # The envelope recipients it came to (a RETURN_PATH or a FEEDBACK_ADDRESSES address).
    recipients = models.TextField(_("sent to"), blank=True)
    sender = models.TextField(_("from"), blank=True)
    subject = models.TextField(_("subject"), blank=True)
    message = models.BinaryField(_("message"))
    # Why it was kept, when not only because nobody could read it (a mailbox's fetch cut short).
    note = models.TextField(_("note"), blank=True, default="")

    class Meta:
        db_table = "bumail_queue_returned_mail"
        verbose_name = _("unread returned mail")
        verbose_name_plural = _("unread returned mail")
        ordering = ("-received_at", "-id")
        indexes = (models.Index(fields=("received_at",), name="bumail_queue_returned_at"),)

    def __str__(self) -> str:
        return f"{self.received_at:%Y-%m-%d %H:%M} {self.subject or '(no subject)'}"


class MailboxMessage(models.Model):
    """A message fetched from a mailbox (``queue_inbound --imap``/``--pop3``) while it
    is in flight: ``started`` once fetched and before it is processed, ``done`` once
    processed and until the server has removed it, then deleted. See ``docs/feedback.md``."""

    class State(models.TextChoices):
        STARTED = "started", "started"
        DONE = "done", "done"

    id = models.BigAutoField(primary_key=True)
    # The mailbox's URL as the command names it (never with a password).
    mailbox = models.CharField(_("mailbox"), max_length=500)
    # SHA-256 of the message's octets, in hex.
    digest = models.CharField(_("digest"), max_length=64)
    state = models.CharField(_("state"), max_length=16, choices=State.choices)
    fetched_at = models.DateTimeField(_("fetched at"))

    class Meta:
        db_table = "bumail_queue_mailbox_message"
        verbose_name = _("message fetched from a mailbox")
        verbose_name_plural = _("messages fetched from a mailbox")
        constraints = (models.UniqueConstraint(fields=("mailbox", "digest"), name="bumail_queue_mailbox_message_once"),)

    def __str__(self) -> str:
        return f"{self.mailbox} {self.digest[:12]} {self.state}"


class BulkAction(models.Model):
    """An operator's bulk action on the queue (``queue_hold``, ``queue_release``,
    ``queue_cancel``, ``queue_retry`` by filter): who, which action, the filter, and how
    many items it matched, changed and left alone. A dry run is not recorded."""

    class Action(models.TextChoices):
        HOLD = "hold", "hold"
        RELEASE = "release", "release"
        CANCEL = "cancel", "cancel"
        RETRY = "retry", "retry"

    id = models.BigAutoField(primary_key=True)
    acted_at = models.DateTimeField(_("acted at"))
    # Who asked: ``--by``, else the operating system's user of a command.
    by = models.CharField(_("by"), max_length=150)
    action = models.CharField(_("action"), max_length=16, choices=Action.choices)
    # The filter as given: {"domain": ..., "channel": ..., "older_than": seconds, ...}.
    filter = models.JSONField(_("filter"), default=dict)
    matched = models.PositiveBigIntegerField(_("matched"), default=0)
    changed = models.PositiveBigIntegerField(_("changed"), default=0)
    skipped = models.PositiveBigIntegerField(_("skipped"), default=0)
    # Empty when it ran to its end; else why it stopped (the error's first line).
    stopped = models.TextField(_("stopped"), blank=True, default="")

    class Meta:
        db_table = "bumail_queue_bulk_actions"
        verbose_name = _("bulk action")
        verbose_name_plural = _("bulk actions")
        ordering = ("-acted_at", "-id")

    def __str__(self) -> str:
        return f"{self.acted_at:%Y-%m-%d %H:%M} {self.action} by {self.by}: {self.changed}"


class ArchivedMessage(models.Model):
    """A message kept after its delivery (``ARCHIVE``, per channel), to be shown and
    resent: whole until ``body_until``, then its header section alone until
    ``keep_until``, then deleted. Kept in the database ``BUMAIL_QUEUE['DATABASE']``
    names whatever store keeps the queue. See ``docs/operations.md``."""

    # The item's id: an archived message is the item's, once it left the queue.
    item_id = models.UUIDField(_("item id"), primary_key=True)
    archived_at = models.DateTimeField(_("archived at"))
    channel = models.CharField(_("channel"), max_length=CHANNEL_MAX_LENGTH, default=DEFAULT_CHANNEL)
    # The item's priority, which a resend keeps.
    priority = models.SmallIntegerField(_("priority"), default=DEFAULT_PRIORITY)
    sender = models.TextField(_("sender"), blank=True)
    # The envelope recipients, one per line (what queue_forget and queue_export search).
    recipients = models.TextField(_("recipients"), blank=True)
    subject = models.TextField(_("subject"), blank=True)
    message_id = models.TextField(_("Message-ID"), blank=True)
    # The header section as enqueued; ``data`` is the whole message, NULL once redacted.
    headers = models.BinaryField(_("headers"))
    data = models.BinaryField(_("message"), null=True)
    body_until = models.DateTimeField(_("message kept until"))
    keep_until = models.DateTimeField(_("headers kept until"))
    # The item this message's item was a resend of (``queue_resend``), if any.
    resent_from = models.UUIDField(_("resent from"), null=True, blank=True)

    class Meta:
        db_table = "bumail_queue_archive"
        verbose_name = _("archived message")
        verbose_name_plural = _("archived messages")
        ordering = ("-archived_at", "-item_id")
        indexes = (
            models.Index(fields=("archived_at",), name="bumail_queue_archive_at"),
            # The retention's two steps: bodies to drop, rows to delete.
            models.Index(fields=("body_until",), name="bumail_queue_archive_body"),
            models.Index(fields=("keep_until",), name="bumail_queue_archive_keep"),
        )

    def __str__(self) -> str:
        return f"{self.archived_at:%Y-%m-%d %H:%M} {self.subject or '(no subject)'}"


class ResentMessage(models.Model):
    """An item made by resending an archived message (``queue.resend``): the link from
    the new item to the one it resends, written as it is queued, so the archive can
    name its resends before they are delivered (and ``resent_from`` once they are)."""

    # The new item's id.
    item_id = models.UUIDField(_("item id"), primary_key=True)
    resent_from = models.UUIDField(_("resent from"), db_index=True)
    resent_at = models.DateTimeField(_("resent at"))
    # Who asked: the admin's user, ``--by``, else the operating system's user of a command.
    by = models.CharField(_("by"), max_length=150, blank=True)

    class Meta:
        db_table = "bumail_queue_resent"
        verbose_name = _("resent message")
        verbose_name_plural = _("resent messages")
        ordering = ("-resent_at", "-item_id")

    def __str__(self) -> str:
        return f"{self.item_id} resent from {self.resent_from}"
