"""What the admin shows of a message: headers, bodies, attachments, sanitised HTML."""

from __future__ import annotations

import email.message

import pytest
from django.core.mail import EmailMessage
from django.utils import timezone

from bumail_queue.conf import get_settings
from bumail_queue.preview import (
    BODY_LIMIT,
    preview,
    sanitise_html,
    srcdoc_for,
    summarize_head,
)
from bumail_queue.queries import ItemQuery, headers_contain
from bumail_queue.stores.memory import MemoryStore
from bumail_queue.stores.orm import ORMStore
from tests.factories import NewItemFactory


def as_bytes(message):
    return message.message().as_bytes()


@pytest.mark.parametrize(
    "attack",
    [
        "<script>alert(1)</script>",
        '<img src="x" onerror="alert(1)">',
        '<a href="javascript:alert(1)">x</a>',
        '<a href="JaVaScRiPt:alert(1)">x</a>',
        '<iframe src="https://evil.example"></iframe>',
        '<object data="x.swf"></object>',
        '<form action="https://evil.example"><input name="password"></form>',
        '<svg onload="alert(1)"><script>alert(1)</script></svg>',
        '<style>body{background:url("https://tracker.example/")}</style>',
        '<div style="position:fixed;top:0;left:0;width:100%;height:100%">over the page</div>',
        '<meta http-equiv="refresh" content="0;url=https://evil.example">',
        '<base href="https://evil.example/">',
        '<math><mi xlink:href="javascript:alert(1)">x</mi></math>',
    ],
)
def test_sanitising_removes_what_could_run_or_escape(attack):
    cleaned = sanitise_html(f"<p>before</p>{attack}<p>after</p>").lower()
    for bad in (
        "<script",
        "onerror",
        "onload",
        "javascript:",
        "<iframe",
        "<object",
        "<form",
        "<input",
        "<style",
        "position",
        "<meta",
        "<base",
        "url(",
    ):
        assert bad not in cleaned
    assert "<p>before</p>" in cleaned and "<p>after</p>" in cleaned


def test_sanitising_keeps_the_look_of_a_mail():
    markup = '<table width="600" cellpadding="4"><tr><td style="color: #333; font-weight: bold" bgcolor="#eee">Hi</td></tr></table><a href="https://shop.example/">shop</a>'
    cleaned = sanitise_html(markup)
    assert 'width="600"' in cleaned and 'bgcolor="#eee"' in cleaned
    assert "color:#333" in cleaned.replace(" ", "") and "font-weight:bold" in cleaned.replace(" ", "")
    assert 'href="https://shop.example/"' in cleaned and 'rel="noopener noreferrer nofollow"' in cleaned


def test_the_preview_frame_loads_nothing_and_runs_nothing():
    document = srcdoc_for("<p>x</p>")
    assert "default-src 'none'" in document and "img-src data:" in document
    assert "script-src" not in document  # default-src 'none' covers scripts


def test_preview_of_a_mail_with_html_text_and_attachments():
    message = email.message.EmailMessage()
    message["Subject"] = "Café news"
    message["From"] = "News <news@example.com>"
    message["To"] = "ann@example.org"
    message.set_content("Plain text body")
    message.add_alternative('<p>Hi <img src="cid:logo@example.com"></p>', subtype="html")
    message.get_payload()[1].add_related(
        b"\x89PNG\r\n\x1a\nfake", maintype="image", subtype="png", cid="<logo@example.com>", disposition="inline"
    )
    message.add_attachment(b"%PDF-1.4 fake", maintype="application", subtype="pdf", filename="report.pdf")
    shown = preview(message.as_bytes())
    assert shown.subject == "Café news"
    assert ("From", "News <news@example.com>") in shown.headers
    assert shown.text.rstrip("\n") == "Plain text body"
    assert 'src="data:image/png;base64,' in shown.html  # the inline image, from the message itself
    assert [(a.filename, a.content_type, a.size, a.inline) for a in shown.attachments] == [
        ("", "image/png", 12, True),
        ("report.pdf", "application/pdf", 13, False),
    ]
    assert not shown.truncated


def test_preview_of_a_plain_message_and_of_a_broken_one():
    shown = preview(as_bytes(EmailMessage("Hi", "Just text", "a@example.com", ["b@example.org"])))
    assert (shown.text.rstrip("\n"), shown.html, shown.attachments) == ("Just text", None, [])
    broken = preview(
        b"Subject: =?unknown-8bit?q?x?=\r\nContent-Type: text/plain; charset=no-such-charset\r\n\r\n\xff\xfe body"
    )
    assert broken.text is not None and "body" in broken.text


def test_a_long_body_is_cut():
    shown = preview(as_bytes(EmailMessage("Long", "x" * (BODY_LIMIT + 10), "a@example.com", ["b@example.org"])))
    assert len(shown.text) == BODY_LIMIT and shown.truncated


def test_summarize_head_reads_subject_and_from_from_the_first_bytes():
    data = as_bytes(EmailMessage("Ünïcode subject", "body", "Shop <shop@example.com>", ["b@example.org"]))
    head = summarize_head(data[:400])
    assert (head.subject, head.from_) == ("Ünïcode subject", "Shop <shop@example.com>")
    assert summarize_head(b"garbage without headers").subject == ""


def test_headers_contain_looks_at_the_header_block_only():
    data = b"Subject: Monthly invoice\r\nMessage-ID: <abc@example.com>\r\n\r\nbody mentions pizza\r\n"
    assert headers_contain(data, "INVOICE")
    assert headers_contain(data, "abc@example.com")
    assert not headers_contain(data, "pizza")
    assert headers_contain(b"Subject: lf only\n\nbody", "lf only")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("store_class", [MemoryStore, ORMStore])
def test_the_orm_and_memory_stores_find_an_item_by_a_word_of_its_subject(store_class):
    # The contract leaves the headers out of ``text``; these two stores look there too.
    store = store_class(get_settings())
    wanted = store.add(NewItemFactory(message=b"From: a@example.com\r\nSubject: Your Invoice 42\r\n\r\nbody\r\n"))
    store.add(NewItemFactory(message=b"Subject: Hello\r\n\r\nthe word invoice in the body only\r\n"))
    store.add(NewItemFactory(message=b"Subject: Hello\n\ninvoice after a bare LF blank line\n"))
    found = store.search(ItemQuery(now=timezone.now(), text="invoice 42"))
    assert [i.id for i in found] == [wanted.id]
    assert [i.id for i in store.search(ItemQuery(now=timezone.now(), text="INVOICE"))] == [wanted.id]
    assert store.search(ItemQuery(now=timezone.now(), text="invoice", state="deferred")) == []
