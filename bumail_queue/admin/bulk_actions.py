"""The queue list's actions beyond retry and cancel: hold and release the selected rows,
and any action on *all the items matching the list's filter* (Django's "select all"
across pages), through a confirmation page and the service's bulk actions
(``operations.bulk``), which leave an audit entry (``BulkAction``).

The list's filter is read here once (``ListFilter``), for the list and for the bulk
action alike, so that an action on all matching items is for the items the list
shows. A filter with no exact ``BulkFilter`` (the search box, the priority) is
refused for "all matching", never widened or narrowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.formats import number_format
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.items import check_channel, check_priority
from bumail_queue.operations.bulk import Action, BulkFilter, BulkResult
from bumail_queue.queries import ItemState
from bumail_queue.service import queue

from .bulk import filter_in_words

RETRY = "retry_now"
CANCEL = "cancel"
HOLD = "hold"
RELEASE = "release"
#: The list's actions, by the value its form posts, as the bulk actions name them.
ACTIONS = {HOLD: Action.HOLD, RELEASE: Action.RELEASE, CANCEL: Action.CANCEL, RETRY: Action.RETRY}
#: The list's hidden input that asks for every matching item rather than the selected.
SELECT_ACROSS = "select_across"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ListFilter:
    """The queue list's filter, as its query string gives it; a value no item can have
    (an unknown state, a bad channel) is no filter, as the list shows it."""

    state: ItemState | None = None
    domain: str = ""
    text: str = ""
    channel: str | None = None
    priority: int | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> ListFilter:
        state = query.get("state") or ""
        try:
            channel: str | None = check_channel(query.get("channel") or "")
        except QueueError:
            channel = None
        try:
            priority: int | None = check_priority(int(query.get("priority") or ""))
        except (ValueError, QueueError):
            priority = None
        return cls(
            state=ItemState(state) if state in set(ItemState) else None,
            domain=(query.get("domain") or "").strip()[:255],
            text=(query.get("q") or "").strip()[:320],
            channel=channel,
            priority=priority,
        )

    @property
    def is_filtered(self) -> bool:
        return bool(self.state or self.domain or self.text or self.channel) or self.priority is not None

    @property
    def params(self) -> dict[str, str]:
        """The query string's values that filter the list (to keep them in its links)."""
        given = (("state", self.state or ""), ("domain", self.domain), ("q", self.text), ("channel", self.channel))
        params = {key: str(value) for key, value in given if value}
        if self.priority is not None:
            params["priority"] = str(self.priority)
        return params

    @property
    def refusal(self) -> str | None:
        """Why no action can be for all the items matching this filter; ``None`` if one can."""
        if self.text:
            # A search also matches part of an address and the subject, which no bulk filter does.
            return _("An action on all matching items cannot follow a search: filter by state, domain or channel.")
        if self.priority is not None:
            return _("An action on all matching items cannot filter by priority: filter by state, domain or channel.")
        if not self.is_filtered:
            return _("Filter the list first: an action on all matching items needs a filter.")
        return None

    def bulk_filter(self) -> BulkFilter:
        """The bulk actions' filter matching exactly the items this filter lists."""
        refusal = self.refusal
        if refusal is not None:
            raise QueueError(ErrorCode.INVALID, refusal)
        return BulkFilter(state=self.state, domain=self.domain or None, channel=self.channel)


def _count(n: int) -> str:
    return number_format(n, force_grouping=True)


def all_matching_context(wanted: ListFilter, *, shown: int, whole: bool) -> dict[str, Any]:
    """What the list's template needs to offer "all matching": how many items match when
    the page shows them all (``whole``; counting a larger set would read the whole
    queue), or why it cannot be offered."""
    if not wanted.is_filtered:
        return {}
    refusal = wanted.refusal
    if refusal is not None:
        return {"all_matching_refused": refusal}
    return {"all_matching": True, "all_matching_count": _count(shown) if whole else None}


class ItemPages(Protocol):
    """What the pages here need of the items' model admin."""

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]: ...

    def message_user(self, request: HttpRequest, message: str, level: int = ...) -> None: ...


def hold_or_release_selected(pages: ItemPages, request: HttpRequest, action: str, ids: Sequence[str]) -> None:
    """Hold or release the selected items, and say what was done."""
    if action == HOLD:
        held = queue.hold_items(ids)
        parts = [ngettext("%d item held", "%d items held", len(held.changed)) % len(held.changed)]
        if held.leased:
            busy = len(held.leased)
            parts.append(
                ngettext("%d was being delivered, left alone", "%d were being delivered, left alone", busy) % busy
            )
        if held.unchanged:
            left = len(held.unchanged)
            parts.append(
                ngettext("%d was held already or no longer queued", "%d were held already or no longer queued", left)
                % left
            )
        done = len(held.changed)
    else:
        released = queue.release_items(ids)
        parts = [ngettext("%d item released", "%d items released", len(released.changed)) % len(released.changed)]
        if released.unchanged:
            left = len(released.unchanged)
            parts.append(ngettext("%d was not held", "%d were not held", left) % left)
        done = len(released.changed)
    pages.message_user(request, "; ".join(parts) + ".", messages.SUCCESS if done else messages.WARNING)


#: A bulk action of the service: ``queue.hold`` and the others.
_Run = Callable[..., BulkResult]


def _runner(action: Action) -> _Run:
    return {
        Action.HOLD: queue.hold,
        Action.RELEASE: queue.release,
        Action.CANCEL: queue.cancel_matching,
        Action.RETRY: queue.retry_matching,
    }[action]


def _title(action: Action, count: int, words: str) -> str:
    if count == 0:
        return {
            Action.HOLD: _("No item to hold matches: %(filter)s"),
            Action.RELEASE: _("No held item matches: %(filter)s"),
            Action.CANCEL: _("No item to cancel matches: %(filter)s"),
            Action.RETRY: _("No item to retry matches: %(filter)s"),
        }[action] % {"filter": words}
    counted = {
        Action.HOLD: ngettext("Hold the %(count)s item matching: %(filter)s", "Hold all %(count)s items matching: %(filter)s", count),
        Action.RELEASE: ngettext("Release the %(count)s held item matching: %(filter)s", "Release all %(count)s held items matching: %(filter)s", count),
        Action.CANCEL: ngettext("Cancel the %(count)s item matching: %(filter)s", "Cancel all %(count)s items matching: %(filter)s", count),
        Action.RETRY: ngettext("Retry the %(count)s item matching: %(filter)s", "Retry all %(count)s items matching: %(filter)s", count),
    }  # fmt: skip
    return counted[action] % {"count": _count(count), "filter": words}


def _done_message(result: BulkResult) -> str:
    n, skipped = result.count, result.skipped
    done = {
        Action.HOLD: ngettext("Held %(count)s item", "Held %(count)s items", n),
        Action.RELEASE: ngettext("Released %(count)s item", "Released %(count)s items", n),
        Action.CANCEL: ngettext("Cancelled %(count)s item", "Cancelled %(count)s items", n),
        Action.RETRY: ngettext("Retried %(count)s item", "Retried %(count)s items", n),
    }[result.action] % {"count": _count(n)}
    if not skipped:
        return done + "."
    left = {
        Action.HOLD: ngettext(
            "%(count)s was being delivered (or changed meanwhile) and was left alone",
            "%(count)s were being delivered (or changed meanwhile) and were left alone",
            skipped,
        ),
        Action.RELEASE: ngettext("%(count)s was no longer held", "%(count)s were no longer held", skipped),
        Action.CANCEL: ngettext("%(count)s was no longer queued", "%(count)s were no longer queued", skipped),
        Action.RETRY: ngettext(
            "%(count)s was being delivered (or changed meanwhile) and was left alone",
            "%(count)s were being delivered (or changed meanwhile) and were left alone",
            skipped,
        ),
    }[result.action] % {"count": _count(skipped)}
    return f"{done}; {left}."


def _failure(action: Action, error: QueueError, *, confirmed: bool) -> str:
    if error.code == ErrorCode.INVALID:  # refused before anything was done
        return error.message
    if not confirmed:
        return _("The items for the %(action)s could not be counted: %(error)s") % {
            "action": action.value,
            "error": error.message,
        }
    # Stopped part way: the audit entry was written with what it did.
    return _("The %(action)s stopped: %(error)s The bulk actions' audit says how far it went.") % {
        "action": action.value,
        "error": error.message,
    }


class AllMatching:
    """An action on all the items matching the list's filter (its query string): a
    confirmation page with the count and a sample (a dry run), then, confirmed, the
    action itself, by the user, and back to the list with its filter.

    The caller has checked the action's permission.
    """

    def __init__(self, pages: ItemPages, *, list_url: str) -> None:
        self.pages = pages
        self.list_url = list_url

    def __call__(self, request: HttpRequest, name: str, back: str) -> HttpResponse:
        action = ACTIONS.get(name)
        if action is None:  # the caller's permission check knows every action: a safeguard
            raise PermissionDenied
        listed = ListFilter.from_query(request.GET)
        back = back or self.list_url + _query(listed.params)
        run = _runner(action)
        confirmed = request.POST.get("confirm") == "yes"
        try:
            wanted = listed.bulk_filter()
            if not confirmed:
                return self._confirm(request, name, action, wanted, run(wanted, dry_run=True), back)
            result = run(wanted, by=request.user.get_username())
        except QueueError as error:
            self.pages.message_user(request, _failure(action, error, confirmed=confirmed), messages.ERROR)
            return HttpResponseRedirect(back)
        self.pages.message_user(request, _done_message(result), messages.SUCCESS if result.count else messages.WARNING)
        return HttpResponseRedirect(back)

    def _confirm(
        self, request: HttpRequest, name: str, action: Action, wanted: BulkFilter, found: BulkResult, back: str
    ) -> HttpResponse:
        words = filter_in_words(wanted.to_dict())
        context = self.pages._context(
            request,
            _title(action, found.count, words),
            action=name,
            bulk_action=action.value,
            filter_words=words,
            count=found.count,
            skipped=found.skipped,
            sample=[(s, s.recipients[:3], max(0, len(s.recipients) - 3)) for s in found.sample],
            more=max(0, found.count - len(found.sample)),
            post_url=request.get_full_path(),
            select_across=SELECT_ACROSS,
            next=back,
        )
        return TemplateResponse(request, "admin/bumail_queue/item/bulk_confirmation.html", context)


def _query(params: Mapping[str, str]) -> str:
    return "?" + urlencode(params) if params else ""
