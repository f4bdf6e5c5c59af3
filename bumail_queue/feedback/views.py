"""The one-click unsubscribe view (RFC 8058), which ``bumail_queue.urls`` serves.

- ``POST``: the mailbox provider's one-click post (body ``List-Unsubscribe=One-Click``)
  or the confirmation page's button. No session, no login, no CSRF token: the token's
  signature is the authority (RFC 8058 §3.2 wants a post with no cookie to work).
  ``200`` with a short page, never a redirect; the same again for a second post.
- ``GET``: a confirmation page with that button, and nothing changed: link scanners
  and previews follow every link of a message.
- A token that is not one of ours (forged, altered, cut short): ``403``, nothing written.
- The store down: ``503`` with ``Retry-After``, nothing written; the provider, or the
  person, posts again.

The page is ``bumail_queue/unsubscribe.html``, which a site may override; it gets
``state`` (``confirm``, ``done``, ``refused``, ``unavailable``), ``channel`` and ``address``.
"""

from __future__ import annotations

import logging
from typing import Final

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from bumail_queue.errors import ErrorCode, QueueError
from bumail_queue.list_unsubscribe import read_token
from bumail_queue.service import queue

from .unsubscribe import apply

logger = logging.getLogger("bumail_queue.feedback")

TEMPLATE: Final = "bumail_queue/unsubscribe.html"
RETRY_AFTER_SECONDS: Final = 300
_UNAVAILABLE: Final = frozenset({ErrorCode.STORE_UNAVAILABLE, ErrorCode.STORE_FULL})


@csrf_exempt
@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def unsubscribe(request: HttpRequest, token: str) -> HttpResponse:
    """Confirm (``GET``) or apply (``POST``) the unsubscribe ``token`` names."""
    named = read_token(token)
    if named is None:
        return _page(request, "refused", {}, status=403)
    context: dict[str, object] = {"channel": named.channel, "address": named.address}
    if request.method != "POST":
        return _page(request, "confirm", context)
    try:
        apply(named, service=queue)
    except QueueError as error:
        if error.code not in _UNAVAILABLE:
            raise
        logger.warning("one-click unsubscribe not recorded channel=%s: %s", named.channel, error)
        response = _page(request, "unavailable", context, status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    return _page(request, "done", context)


def _page(request: HttpRequest, state: str, context: dict[str, object], *, status: int = 200) -> HttpResponse:
    response = render(request, TEMPLATE, {"state": state, **context}, status=status)
    # The URL holds the token: no page it leads to learns it.
    response["Referrer-Policy"] = "no-referrer"
    response["X-Robots-Tag"] = "noindex"
    return response
