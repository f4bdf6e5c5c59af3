"""The pages of the example: write a mail, list the queue, cancel an item.

Nothing here knows about the queue's tables: the mail goes through Django's own
``send_mail()`` (the queue is the configured email backend), and the queue page
reads and cancels through ``bumail_queue.queue``.
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.core.mail import send_mail
from django.core.management import get_commands
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from bumail_queue import queue
from bumail_queue.errors import QueueError

from .forms import ComposeForm

#: How many items the queue page shows.
PAGE_SIZE = 100


@require_http_methods(["GET", "POST"])
def compose(request: HttpRequest) -> HttpResponse:
    """Show the form; on a valid POST, send the mail (that is, queue it) and show the queue."""
    form = ComposeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            send_mail(data["subject"], data["body"], None, [data["to"]])
        except QueueError as error:
            form.add_error(None, error.message)
        else:
            messages.success(request, f"Your mail to {data['to']} is in the queue.")
            return redirect("mailing:queue")
    return render(request, "mailing/compose.html", {"form": form})


@require_http_methods(["GET"])
def queue_list(request: HttpRequest) -> HttpResponse:
    """List the queue, earliest due first, with a cancel button per item."""
    context = {
        "items": queue.list(limit=PAGE_SIZE),
        "count": queue.count(),
        "page_size": PAGE_SIZE,
        "worker_available": "queue_worker" in get_commands(),
    }
    return render(request, "mailing/queue.html", context)


@require_POST
def cancel(request: HttpRequest, item_id: uuid.UUID) -> HttpResponse:
    """Drop an item and its message from the queue (no bounce is sent)."""
    item = queue.cancel(str(item_id))
    if item is None:
        messages.warning(request, f"Item {item_id} was no longer in the queue.")
    else:
        addresses = ", ".join(r.address for r in item.recipients)
        messages.success(request, f"Cancelled item {item.id} (to {addresses}).")
    return redirect("mailing:queue")
