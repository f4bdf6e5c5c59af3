"""``manage.py seed_queue``: fill the queue with sample mail in every state, for the admin.

The mail is queued through ``bumail_queue.queue``; the states a worker would give it
(deferred with a server's reply, being delivered, partly delivered) are made through
the store's own claim and record steps, and the delivery log gets the history such
attempts write. Nothing is sent anywhere. For the demo, the docs' screenshots and the
browser tests.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.mail import EmailMultiAlternatives
from django.core.management.base import BaseCommand
from django.utils import timezone

from bumail_queue import delivery_log
from bumail_queue.items import AttemptResult, Outcome, QueueItem, RecipientStatus, Reply
from bumail_queue.service import QueueService, queue

OK = Reply(code=250, status="2.0.0", text="OK: queued as 4Xk2Lq1d9Bz")
GREYLISTED = Reply(code=451, status="4.7.1", text="Greylisted, please try again in 5 minutes")
BUSY = Reply(code=421, status="4.7.0", text="Too many connections from your host, slow down")
NO_SUCH_USER = Reply(code=550, status="5.1.1", text="The email account that you tried to reach does not exist")

ORDER_HTML = """
<table width="100%" cellpadding="0" cellspacing="0" bgcolor="#f4f4f7"><tr><td align="center">
<table width="560" cellpadding="24" bgcolor="#ffffff" style="border-radius: 6px; font-family: Helvetica, Arial, sans-serif">
<tr><td>
<h1 style="color: #1f2d3d; font-size: 22px">Your order #1042 has shipped</h1>
<p style="color: #51545e; line-height: 1.5">Hello Alice, good news: your parcel is on its way and should arrive
within three working days.</p>
<table width="100%" cellpadding="6" style="border-collapse: collapse; color: #333">
<tr><td style="border-bottom: 1px solid #eaeaec">Trail running shoes, size 39</td><td align="right" style="border-bottom: 1px solid #eaeaec">€89.00</td></tr>
<tr><td style="border-bottom: 1px solid #eaeaec">Merino socks (3 pairs)</td><td align="right" style="border-bottom: 1px solid #eaeaec">€24.00</td></tr>
<tr><td><strong>Total</strong></td><td align="right"><strong>€113.00</strong></td></tr>
</table>
<p><a href="https://shop.example.com/orders/1042" style="background: #3869d4; color: #ffffff; padding: 10px 18px; border-radius: 4px; text-decoration: none">Track your parcel</a></p>
<p style="color: #9a9ea6; font-size: 12px">Shop Example, 1 Market Street</p>
<script>document.body.innerHTML = "<h1 id='pwned'>pwned</h1>"; window.top.document.title = "pwned";</script>
<img src="https://tracker.example.com/open.gif?u=alice" width="1" height="1" onerror="window.top.location='https://evil.example.com'">
</td></tr></table>
</td></tr></table>
"""


def _mail(
    subject: str, to: list[str], *, sender: str = "Shop Example <shop@example.com>", html: str | None = None
) -> EmailMultiAlternatives:
    text = f"{subject}\n\nThis is a sample message queued by manage.py seed_queue.\n"
    message = EmailMultiAlternatives(subject, text, sender, to)
    if html is not None:
        message.attach_alternative(html, "text/html")
    return message


class Command(BaseCommand):
    help = "Queue sample mail in every state (queued, deferred, being delivered) with its delivery history."

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        store = queue.store

        def enqueue(
            message: EmailMultiAlternatives, *, age: timedelta = timedelta(0), at: datetime | None = None
        ) -> QueueItem:
            return QueueService(clock=lambda: now - age).enqueue(message, at=at)

        def attempt(
            item: QueueItem,
            outcomes: dict[str, Reply],
            *,
            when: datetime,
            host: str,
            retry_in: timedelta,
            owner: str = "worker-1",
        ) -> None:
            # Lease this item alone, as a worker's claim would, then record the attempt.
            claimed = store.claim(owner=owner, now=now, lease_until=now + timedelta(minutes=10), limit=1000)
            for other in claimed:
                if other.id != item.id:
                    store.reschedule(other.id, at=other.created_at, owner=owner)
            decided = {address: Outcome(status=_status(reply), reply=reply) for address, reply in outcomes.items()}
            store.complete(item.id, owner=owner, result=AttemptResult(outcomes=decided, next_attempt_at=now + retry_in))
            for address, outcome in decided.items():
                delivery_log.record(
                    item_id=item.id, recipient=address, status=outcome.status.value, reply=outcome.reply,
                    envelope_sender=item.sender, remote_host=host, at=when,
                    next_attempt_at=now + retry_in if outcome.status == RecipientStatus.DEFERRED else None,
                )  # fmt: skip

        order = enqueue(
            _mail("Your order #1042 has shipped", ["alice@example.org"], html=ORDER_HTML), age=timedelta(minutes=47)
        )
        attempt(
            order,
            {"alice@example.org": GREYLISTED},
            when=now - timedelta(minutes=46),
            host="mx1.example.org",
            retry_in=timedelta(minutes=13),
        )

        invoice = _mail("Invoice 2026-114", ["billing@customer.example.net"], sender="Accounts <accounts@example.com>")
        invoice.attach("invoice-2026-114.pdf", b"%PDF-1.4\n% a sample invoice\n", "application/pdf")
        invoice_item = enqueue(invoice, age=timedelta(hours=6, minutes=20))
        attempt(
            invoice_item,
            {"billing@customer.example.net": BUSY},
            when=now - timedelta(hours=6),
            host="mail.customer.example.net",
            retry_in=timedelta(minutes=74),
        )

        digest_to = [
            "ann@example.org",
            "ben@example.net",
            "cleo@example.com",
            "dan@example.org",
            "eve@mail.example.net",
            "noone@example.org",
        ]
        digest = enqueue(
            _mail(
                "Weekly digest: 5 new articles",
                digest_to,
                sender="Newsletter <news@example.com>",
                html="<h2>This week</h2><ul><li>Five new articles</li></ul>",
            ),
            age=timedelta(hours=26),
        )
        attempt(
            digest,
            {"ann@example.org": OK, "ben@example.net": OK, "cleo@example.com": GREYLISTED, "dan@example.org": GREYLISTED, "eve@mail.example.net": BUSY, "noone@example.org": NO_SUCH_USER},
            when=now - timedelta(hours=25), host="mx.example.net", retry_in=timedelta(minutes=35),
        )  # fmt: skip

        for n, who in enumerate(["frank@example.com", "gina@example.net", "hugo@example.org", "iris@example.com"]):
            enqueue(
                _mail(f"Welcome to Shop Example, {who.split('@')[0].title()}", [who]), age=timedelta(minutes=2 + 7 * n)
            )
        enqueue(
            _mail("Your appointment tomorrow at 10:00", ["jules@example.net"], sender="Clinic <reminders@example.com>"),
            at=now + timedelta(hours=16),
        )

        reset = enqueue(
            _mail("Reset your password", ["bob@example.net"], sender="Shop Example <no-reply@example.com>"),
            age=timedelta(seconds=40),
        )
        claimed = store.claim(owner="worker-2-pid-4242", now=now, lease_until=now + timedelta(minutes=10), limit=1000)
        for other in claimed:
            if other.id != reset.id:
                store.reschedule(other.id, at=other.created_at, owner="worker-2-pid-4242")
        self.stdout.write(f"Queued {queue.count()} sample items.")


def _status(reply: Reply) -> RecipientStatus:
    return {2: RecipientStatus.DELIVERED, 4: RecipientStatus.DEFERRED}.get(
        (reply.code or 400) // 100, RecipientStatus.FAILED
    )
