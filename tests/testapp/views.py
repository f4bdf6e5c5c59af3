"""Views that send mail the way a project's views do."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.mail import EmailMessage, send_mail, send_mass_mail
from django.db import transaction
from django.http import HttpRequest, HttpResponse

from bumail_queue import queue


def send_one(request: HttpRequest) -> HttpResponse:
    send_mail("Welcome", "Hello there.", None, [request.GET.get("to", "user@example.org")])
    return HttpResponse("sent")


def send_many(request: HttpRequest) -> HttpResponse:
    count = int(request.GET.get("n", "3"))
    send_mass_mail([(f"Note {i}", "Body", None, [f"user{i}@example.org"]) for i in range(count)])
    return HttpResponse("sent")


def send_then_fail(request: HttpRequest) -> HttpResponse:
    """Send inside the view's transaction, then fail: the mail must not be queued."""
    with transaction.atomic():
        EmailMessage("Doomed", "Never sent.", None, ["user@example.org"]).send()
        raise RuntimeError("the view failed after sending")


def send_one_then_fail(request: HttpRequest) -> HttpResponse:
    """Send, then fail: with ATOMIC_REQUESTS the request's transaction takes the mail back."""
    send_mail("Welcome", "Hello there.", None, ["user@example.org"])
    raise RuntimeError("the view failed after sending")


async def send_async(request: HttpRequest) -> HttpResponse:
    """An async view: the enqueue awaited, as the service offers it."""
    item = await queue.aenqueue(
        EmailMessage("Welcome", "Hello there.", None, [request.GET.get("to", "user@example.org")])
    )
    return HttpResponse(item.id)


@sync_to_async
def _welcome_in_a_transaction(fail: bool) -> str:
    with transaction.atomic():
        item = queue.enqueue(EmailMessage("Welcome", "Hello there.", None, ["user@example.org"]))
        if fail:
            raise RuntimeError("the work after the enqueue failed")
        return item.id


async def send_async_in_a_transaction(request: HttpRequest) -> HttpResponse:
    """An async view whose enqueue belongs to a transaction: the sync work awaited whole."""
    try:
        item_id = await _welcome_in_a_transaction(request.GET.get("fail") == "1")
    except RuntimeError:
        return HttpResponse("rolled back", status=500)
    return HttpResponse(item_id)
