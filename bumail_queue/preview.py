"""What the admin shows of a queued message: headers, bodies, attachments.

The HTML body is never shown as the sender wrote it. nh3 (the Ammonia sanitiser)
keeps a list of harmless tags, attributes, CSS properties and URL schemes and drops
everything else: scripts, event handlers, ``javascript:`` links, forms, frames. The
result is then shown in a sandboxed ``<iframe srcdoc>`` (no scripts, no same origin)
whose own Content-Security-Policy loads nothing from anywhere (``srcdoc_for``): even a
sanitiser bug could neither run code nor fetch a tracking pixel.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import email.message
import email.policy
import functools
import html
import re
from collections.abc import Mapping, Sequence
from email.parser import BytesParser

from .queries import header_block

#: The most of a body the preview shows; the rest is left out, and said so.
BODY_LIMIT = 512 * 1024
#: Inline images (``cid:``) shown in the HTML preview, together at most this large.
INLINE_IMAGES_LIMIT = 2 * 1024 * 1024
_INLINE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: MIME parts nested deeper than this are not previewed: the headers are shown, with a
#: notice. Postfix's ``mime_nesting_limit`` has the same default; the email package's
#: parser and ``walk()`` recurse once per level and reach Python's recursion limit
#: near a thousand.
MIME_NESTING_LIMIT = 100

#: What a preview's document may load: inline styles and the message's own inline
#: images (as data: URIs), nothing else. No script source at all.
PREVIEW_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; form-action 'none'; base-uri 'none'"
)

# The extra tags and attributes mail's HTML keeps beyond nh3's defaults.
_EXTRA_TAGS = frozenset({"font", "big", "tfoot"})
_EXTRA_ATTRIBUTES = {
    "*": {"style", "align", "valign", "width", "height", "bgcolor", "dir", "lang", "title"},
    "font": {"color", "face", "size"},
    "table": {"border", "cellpadding", "cellspacing"},
    "td": {"nowrap"},
    "th": {"nowrap"},
}
# Presentational CSS only: nothing that positions over the page. A background's url()
# stays, as mail buttons need the shorthand, but the preview's CSP refuses every load.
_STYLE_PROPERTIES = frozenset(
    {
        "background", "background-color", "border", "border-bottom", "border-collapse", "border-color", "border-left",
        "border-radius", "border-right", "border-spacing", "border-style", "border-top", "border-width",
        "color", "display", "font", "font-family", "font-size", "font-style", "font-weight", "height",
        "letter-spacing", "line-height", "list-style", "margin", "margin-bottom", "margin-left",
        "margin-right", "margin-top", "max-width", "min-width", "padding", "padding-bottom", "padding-left",
        "padding-right", "padding-top", "text-align", "text-decoration", "text-transform",
        "vertical-align", "white-space", "width", "word-break",
    }
)  # fmt: skip
_CID_SRC = re.compile(r'src="cid:([^"]*)"')


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Attachment:
    """A part of the message that is a file: its name, type and decoded size."""

    filename: str
    content_type: str
    size: int
    inline: bool


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MessagePreview:
    """A message as the admin shows it; ``html`` is sanitised already."""

    headers: list[tuple[str, str]]
    subject: str
    text: str | None
    html: str | None
    attachments: list[Attachment]
    truncated: bool = False
    #: The MIME parts nest deeper than ``MIME_NESTING_LIMIT``: only the headers are shown.
    too_deep: bool = False

    @property
    def nesting_limit(self) -> int:
        """Return how deep MIME parts may nest to be shown (for the admin's notice)."""
        return MIME_NESTING_LIMIT


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HeadSummary:
    """What the admin's list shows of a message, read from its first bytes."""

    subject: str
    from_: str


def _parse(data: bytes) -> email.message.EmailMessage:
    message = BytesParser(policy=email.policy.default).parsebytes(data)
    assert isinstance(message, email.message.EmailMessage)
    return message


def _header_text(message: email.message.Message, name: str) -> str:
    """Return a header decoded (RFC 2047), or as written when it cannot be decoded."""
    try:
        value = message.get(name)
        return "" if value is None else " ".join(str(value).split())
    except Exception:  # a malformed header: show what is there rather than fail the page
        # raw_items() hands the value back as written; get() would parse it again.
        raw = next((value for key, value in message.raw_items() if key.lower() == name.lower()), "")
        return " ".join(str(raw).split())


def summarize_head(head: bytes) -> HeadSummary:
    """Return the subject and the From of a message from its first bytes."""
    message = _parse(header_block(head) + b"\r\n\r\n")
    return HeadSummary(subject=_header_text(message, "Subject"), from_=_header_text(message, "From"))


def _content(part: email.message.EmailMessage) -> str:
    try:
        content = part.get_content()
    except (LookupError, ValueError, AssertionError):  # an unknown charset, a bad encoding
        payload = part.get_payload(decode=True)
        content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else str(payload or "")
    return content if isinstance(content, str) else ""


def _body(message: email.message.EmailMessage, subtype: str) -> email.message.EmailMessage | None:
    try:
        part = message.get_body(preferencelist=(subtype,))
    except Exception:  # a broken MIME tree: no body of that kind
        return None
    return part if isinstance(part, email.message.EmailMessage) else None


def _limited(text: str | None) -> tuple[str | None, bool]:
    if text is None or len(text) <= BODY_LIMIT:
        return text, False
    return text[:BODY_LIMIT], True


def _attachments(
    message: email.message.EmailMessage, bodies: Sequence[email.message.EmailMessage | None]
) -> tuple[list[Attachment], dict[str, str]]:
    """Return the message's files (its ``bodies`` aside), and its inline images as
    data: URIs by Content-ID."""
    found: list[Attachment] = []
    images: dict[str, str] = {}
    budget = INLINE_IMAGES_LIMIT
    if not message.is_multipart():
        return found, images
    body_ids = {id(part) for part in bodies if part is not None}
    for part in message.walk():
        if part.is_multipart() or id(part) in body_ids:
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        content_type = part.get_content_type()
        disposition = part.get_content_disposition()
        filename = part.get_filename() or ""
        if disposition is None and not filename and content_type.startswith("text/"):
            continue  # an alternative body beside the ones shown
        found.append(
            Attachment(filename=filename, content_type=content_type, size=len(data), inline=disposition == "inline")
        )
        content_id = (part.get("Content-ID") or "").strip().strip("<>")
        if content_id and content_type in _INLINE_IMAGE_TYPES and len(data) <= budget:
            budget -= len(data)
            images[content_id] = f"data:{content_type};base64,{base64.b64encode(data).decode('ascii')}"
    return found, images


def sanitise_html(markup: str, inline_images: Mapping[str, str] | None = None) -> str:
    """Return ``markup`` with everything but harmless presentation removed (nh3).

    ``cid:`` image sources found in ``inline_images`` become their data: URIs; made
    of a checked image type and base64 only, they cannot carry markup.
    """
    # Imported here: the admin's list pages and every other command import this module,
    # and only a message's preview needs the sanitiser.
    import nh3

    tags, attributes = _allowed_markup()
    cleaned = nh3.clean(
        markup,
        tags=set(tags),
        clean_content_tags={"script", "style", "title", "head", "template", "noscript"},
        attributes=attributes,
        url_schemes={"http", "https", "mailto", "tel", "cid"},
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
        filter_style_properties=set(_STYLE_PROPERTIES),
    )
    images = inline_images or {}
    return _CID_SRC.sub(lambda m: f'src="{images.get(html.unescape(m.group(1)), "")}"', cleaned)


@functools.cache
def _allowed_markup() -> tuple[frozenset[str], dict[str, set[str]]]:
    """The tags and attributes a preview keeps: nh3's defaults and what mail adds."""
    import nh3

    attributes: dict[str, set[str]] = copy.deepcopy(nh3.ALLOWED_ATTRIBUTES)
    for tag, extra in _EXTRA_ATTRIBUTES.items():
        attributes.setdefault(tag, set()).update(extra)
    return frozenset(nh3.ALLOWED_TAGS | _EXTRA_TAGS), attributes


def srcdoc_for(sanitised: str) -> str:
    """Return the document an ``<iframe sandbox srcdoc>`` shows: the body under a strict CSP."""
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{PREVIEW_CSP}">'
        "<style>body{font-family:system-ui,sans-serif;margin:12px;color:#222;background:#fff}"
        "img{max-width:100%;height:auto}</style></head>"
        f"<body>{sanitised}</body></html>"
    )


def _nested_deeper_than(message: email.message.Message, limit: int) -> bool:
    """Return whether ``message``'s parts nest more than ``limit`` levels, without recursion."""
    stack: list[tuple[email.message.Message, int]] = [(message, 0)]
    while stack:
        part, depth = stack.pop()
        if depth > limit:
            return True
        payload = part.get_payload()
        if isinstance(payload, list):
            stack.extend((child, depth + 1) for child in payload if isinstance(child, email.message.Message))
    return False


def _headers_only(data: bytes) -> MessagePreview:
    """Return the preview of a message too deeply nested to take apart: its headers."""
    message = _parse(header_block(data) + b"\r\n\r\n")
    return MessagePreview(
        headers=[(name, _header_text(message, name)) for name in dict.fromkeys(message.keys())],
        subject=_header_text(message, "Subject"),
        text=None,
        html=None,
        attachments=[],
        too_deep=True,
    )


def preview(data: bytes) -> MessagePreview:
    """Return what the admin shows of a message."""
    try:
        message = _parse(data)
    except RecursionError:
        return _headers_only(data)
    if _nested_deeper_than(message, MIME_NESTING_LIMIT):
        return _headers_only(data)
    headers = [(name, _header_text(message, name)) for name in dict.fromkeys(message.keys())]
    text_part, html_part = _body(message, "plain"), _body(message, "html")
    text, text_cut = _limited(None if text_part is None else _content(text_part))
    markup, html_cut = _limited(None if html_part is None else _content(html_part))
    attachments, images = _attachments(message, (text_part, html_part))
    return MessagePreview(
        headers=headers,
        subject=_header_text(message, "Subject"),
        text=text,
        html=None if markup is None else sanitise_html(markup, images),
        attachments=attachments,
        truncated=text_cut or html_cut,
    )
