"""The page of one address: its queued items, its delivery log, its suppression entries
in every scope and the returned mail that names it, each section shown to those who
may view that part of the queue, with the suppression entries' remove buttons to those
who may delete them.

Reached from every address the other pages show (``address_url``); the page is the
item admin's (``item/address/<address>/``), so it exists wherever the items' pages do.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.timesince import timeuntil
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from bumail_queue.addresses import domain_of, normal_address
from bumail_queue.conf import get_settings
from bumail_queue.items import QueueItem, reply_line
from bumail_queue.models import DeliveryLog, Item, ReturnedMail
from bumail_queue.models import Suppression as SuppressionModel
from bumail_queue.preview import summarize_head
from bumail_queue.queries import ItemState, state_of
from bumail_queue.service import queue
from bumail_queue.suppression import GLOBAL_SCOPE, Suppression, is_scope, scope_label

from .shared import age_text

#: The longest address the page looks up (RFC 5321's path is 256 octets; the list's form takes 320).
MAX_ADDRESS = 320
#: Queued items the page shows; past them, a link to the list searched for the address.
ITEMS_SHOWN = 50
#: Items read per page of the store's search: the search matches substrings, and the
#: page keeps those with the address as a recipient exactly.
SEARCH_PAGE = 200
#: Pages of the search read at most, so that a common substring never reads the whole queue.
SEARCH_PAGES = 5
#: Delivery log entries the page shows, newest first; the log's list has the rest.
LOG_SHOWN = 50
#: Returned messages that name the address, newest first.
RETURNED_SHOWN = 20
#: Bytes of each item's message read for its subject.
HEAD_BYTES = 2048

REMOVE = "remove"
FORGET = "forget"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AddressItem:
    """A queued item as the address's page shows it: this recipient's part of it."""

    item: QueueItem
    state: ItemState
    subject: str
    status: str
    reply: str
    age: str
    due_in: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AddressSuppression:
    """A suppression entry as the address's page shows it."""

    entry: Suppression
    scope: str
    reply: str
    age: str
    expires_in: str


def address_url(admin_site: admin.AdminSite, address: str) -> str | None:
    """The URL of ``address``'s page on ``admin_site``, or ``None`` where the site has no
    item pages."""
    try:
        return reverse(f"{admin_site.name}:bumail_queue_item_address", args=[address])
    except NoReverseMatch:
        return None


class AddressPage:
    """The page of one address, on ``model_admin``'s site (the items' admin)."""

    def __init__(self, model_admin: admin.ModelAdmin[Any]) -> None:
        self.model_admin = model_admin
        self.site = model_admin.admin_site

    # -- permissions ------------------------------------------------------------------

    def _may(self, request: HttpRequest, model: type[Any], action: str = "view") -> bool:
        """Whether the user may ``action`` ``model`` on this site (its admin's own rule)."""
        model_admin = self.site._registry.get(model)
        if model_admin is None:
            return False
        allowed = model_admin.has_view_permission if action == "view" else model_admin.has_delete_permission
        return bool(allowed(request))

    # -- the view ---------------------------------------------------------------------

    def __call__(self, request: HttpRequest, address: str) -> HttpResponse:
        address = address.strip()[:MAX_ADDRESS]
        sees = {
            "items": self._may(request, Item),
            "log": self._may(request, DeliveryLog) and get_settings().delivery_log,
            "suppressions": self._may(request, SuppressionModel),
            "returned": self._may(request, ReturnedMail),
        }
        if not (sees["items"] or self._may(request, DeliveryLog) or sees["suppressions"]):
            raise PermissionDenied
        can_remove = sees["suppressions"] and self._may(request, SuppressionModel, "delete")
        if request.method == "POST":
            if not can_remove:
                raise PermissionDenied
            return self._change_suppressions(request, address)
        now = timezone.now()
        context: dict[str, Any] = {
            **self.site.each_context(request),
            "title": address,
            "address": address,
            "opts": self.model_admin.opts,
            "app_label": self.model_admin.opts.app_label,
            "sees": sees,
            "can_remove": can_remove,
        }
        if sees["items"]:
            items, more = self._items(address, now)
            context |= {
                "items": items,
                "more_items": more,
                "items_url": self._url("bumail_queue_item_changelist", q=address),
            }
        if sees["log"]:
            entries = list(self._log(address)[: LOG_SHOWN + 1])
            context |= {
                "log_entries": entries[:LOG_SHOWN],
                "more_log": len(entries) > LOG_SHOWN,
                "log_url": self._url("bumail_queue_deliverylog_changelist", q=address),
            }
        if sees["suppressions"]:
            context |= {
                "suppressions": [self._suppression(entry, now) for entry in queue.suppressions_for(address)],
                "suppression_on": get_settings().suppression,
                "suppressions_url": self._url("bumail_queue_suppression_changelist", q=address),
            }
        if sees["returned"]:
            context["returned"] = list(self._returned(address)[:RETURNED_SHOWN])
        return TemplateResponse(request, "admin/bumail_queue/address.html", context)

    def _url(self, name: str, **query: str) -> str | None:
        try:
            url = reverse(f"{self.site.name}:{name}")
        except NoReverseMatch:  # a site of your own that leaves that page out
            return None
        return f"{url}?{urlencode(query)}" if query else url

    # -- the sections -----------------------------------------------------------------

    def _items(self, address: str, now: datetime) -> tuple[list[AddressItem], bool]:
        """The queued items with ``address`` as a recipient, earliest due first, and
        whether there may be more than the page shows."""
        found: list[QueueItem] = []
        domain = domain_of(address) or None
        # One mailbox: the local part as written, the domain in any case or script.
        wanted = normal_address(address)
        for page in range(SEARCH_PAGES):
            batch = queue.search(text=address, domain=domain, offset=page * SEARCH_PAGE, limit=SEARCH_PAGE)
            found += [item for item in batch if any(normal_address(r.address) == wanted for r in item.recipients)]
            if len(found) > ITEMS_SHOWN or len(batch) < SEARCH_PAGE:
                more = len(found) > ITEMS_SHOWN or len(batch) == SEARCH_PAGE
                break
        else:
            more = True
        shown = found[:ITEMS_SHOWN]
        heads = queue.store.read_message_heads([item.id for item in shown], size=HEAD_BYTES)
        rows = []
        for item in shown:
            recipient = next(r for r in item.recipients if normal_address(r.address) == wanted)
            head = heads.get(item.id)
            rows.append(
                AddressItem(
                    item=item,
                    state=state_of(item, now),
                    subject=(summarize_head(head).subject or "") if head is not None else "",
                    status=recipient.status,
                    reply=reply_line(recipient.reply),
                    age=age_text(item.created_at, now),
                    due_in=timeuntil(item.next_attempt_at, now, depth=1) if item.next_attempt_at > now else "",
                )
            )
        return rows, more

    def _log(self, address: str) -> Any:
        """The delivery log's entries for ``address``, newest first (its recipient index)."""
        written = {address, normal_address(address)}
        return (
            DeliveryLog.objects.using(get_settings().database)
            .filter(recipient__in=written)
            .order_by("-logged_at", "-id")
        )

    def _returned(self, address: str) -> Any:
        """Returned mail no parser could read that came from or to ``address``."""
        return (
            ReturnedMail.objects.using(get_settings().database)
            .filter(Q(sender__iexact=address) | Q(recipients__icontains=address))
            .defer("message")
            .order_by("-received_at", "-id")
        )

    @staticmethod
    def _suppression(entry: Suppression, now: datetime) -> AddressSuppression:
        return AddressSuppression(
            entry=entry,
            scope=scope_label(entry.scope),
            reply=reply_line(entry.reply),
            age=age_text(entry.created_at, now),
            expires_in=timeuntil(entry.expires_at, now, depth=1),
        )

    # -- removing suppression entries -------------------------------------------------

    def _change_suppressions(self, request: HttpRequest, address: str) -> HttpResponse:
        action = request.POST.get("action")
        if action == FORGET:
            removed = len(queue.forget_suppressions(address))
        elif action == REMOVE:
            scope = request.POST.get("scope") or GLOBAL_SCOPE
            removed = len(queue.unsuppress([address], scope=scope)) if is_scope(scope) else 0
        else:
            self.model_admin.message_user(request, _("Choose an action."), messages.WARNING)
            return HttpResponseRedirect(request.path)
        if removed:
            text = ngettext(
                "%(count)d suppression entry removed.", "%(count)d suppression entries removed.", removed
            ) % {"count": removed}
            self.model_admin.message_user(request, text, messages.SUCCESS)
        else:
            self.model_admin.message_user(request, _("That entry was no longer on the list."), messages.WARNING)
        return HttpResponseRedirect(request.path)
