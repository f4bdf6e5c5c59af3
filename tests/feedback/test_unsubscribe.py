"""One-click unsubscribe (RFC 8058): the signed token, the settings, and the view as a
mailbox provider posts to it (no cookie, no CSRF token), on every store."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest
from django.core import signing
from django.test import Client, override_settings

from bumail_queue import list_unsubscribe
from bumail_queue.conf import ChannelUnsubscribe, load, validate
from bumail_queue.errors import QueueConfigurationError
from bumail_queue.list_unsubscribe import Unsubscribing, make_token, read_token, url_of, with_fields
from bumail_queue.service import QueueService, queue
from bumail_queue.stores import get_store
from bumail_queue.suppression import GLOBAL_SCOPE, Suppression, SuppressionReason, channel_scope
from tests.helpers import signals_told
from tests.servers.smtp import closed_port

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
URL = "https://www.example.com/mail/unsubscribe/"
NEWSLETTER = {"newsletter": {"URL": URL}}
ONE_CLICK_BODY = "List-Unsubscribe=One-Click"  # RFC 8058 §3.2, as a provider posts it
FORM = "application/x-www-form-urlencoded"

pytestmark = pytest.mark.django_db(transaction=True)


# -- the token ---------------------------------------------------------------------------


def test_a_token_names_its_channel_and_address_and_reads_back():
    token = make_token("newsletter", "Ann@Example.ORG")

    assert read_token(token) == Unsubscribing(channel="newsletter", address="Ann@example.org")
    assert "/" not in token and token.isascii() and len(token) < 120  # one URL path segment
    assert make_token("newsletter", "Ann@Example.ORG") == token  # the same link in every copy


@pytest.mark.parametrize(
    "altered",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the signature's last character
        lambda t: t[:-10],  # cut short, as a wrapped line in a mail client cuts it
        lambda t: t.partition(":")[2],  # the signature alone
        lambda t: _payload(["newsletter", "bob@example.org"]) + ":" + t.partition(":")[2],  # another address
        lambda t: _payload(["offers", "ann@example.org"]) + ":" + t.partition(":")[2],  # another channel
        lambda t: "",
        lambda t: "not-a-token",
    ],
    ids=["signature", "cut", "no-payload", "address", "channel", "empty", "junk"],
)
def test_an_altered_token_reads_back_as_nothing(altered):
    assert read_token(altered(make_token("newsletter", "ann@example.org"))) is None


def test_a_token_signed_with_another_key_is_refused():
    with override_settings(SECRET_KEY="an attacker's own key, long enough to look real"):
        forged = make_token("newsletter", "ann@example.org")

    assert read_token(forged) is None


def test_a_token_of_a_key_rotated_into_the_fallbacks_still_reads_back():
    with override_settings(SECRET_KEY="the key of last year, long enough to look real"):
        old = make_token("newsletter", "ann@example.org")

    with override_settings(
        SECRET_KEY="the key of this year, long enough to look real",
        SECRET_KEY_FALLBACKS=["the key of last year, long enough to look real"],
    ):
        assert read_token(old) == Unsubscribing(channel="newsletter", address="ann@example.org")
        assert make_token("newsletter", "ann@example.org") != old  # new mail: the new key
    with override_settings(SECRET_KEY="the key of this year, long enough to look real", SECRET_KEY_FALLBACKS=[]):
        assert read_token(old) is None  # a key dropped from the fallbacks: its links go with it


def test_a_token_is_not_a_verp_or_any_other_signature_of_the_site():
    # Django's signing under another salt (a password reset's, a session's) signs the same
    # payload differently: no other signed value of the site unsubscribes anyone.
    other = signing.Signer(salt="django.contrib.sessions").sign_object(["newsletter", "ann@example.org"])
    assert read_token(other) is None


# -- the header fields -------------------------------------------------------------------


MESSAGE = b"From: news@example.com\r\nTo: ann@example.org\r\nSubject: News\r\n\r\nHello.\r\n"


def test_the_fields_go_first_with_the_url_of_the_recipients_token():
    url = url_of(URL, "newsletter", "ann@example.org")
    sent = with_fields(MESSAGE, url)

    assert sent == (
        b"List-Unsubscribe: <" + url.encode() + b">\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n" + MESSAGE
    )
    token = url.removeprefix(URL).removesuffix("/")
    assert read_token(token) == Unsubscribing(channel="newsletter", address="ann@example.org")


def test_a_message_with_bare_line_feeds_gets_fields_of_its_own_line_ending():
    message = MESSAGE.replace(b"\r\n", b"\n")
    sent = with_fields(message, URL + "t/")
    assert sent.endswith(b"List-Unsubscribe-Post: List-Unsubscribe=One-Click\n" + message)
    assert b"\r" not in sent


@pytest.mark.parametrize("field", [b"List-Unsubscribe", b"list-unsubscribe", b"LIST-UNSUBSCRIBE "])
def test_a_message_with_its_own_list_unsubscribe_keeps_it_and_gets_nothing_added(field):
    own = field + b": <mailto:leave@example.com>\r\n" + MESSAGE
    assert with_fields(own, URL + "t/") == own


def test_a_list_unsubscribe_in_the_body_is_not_the_messages_own():
    quoted = MESSAGE.replace(b"Hello.", b"List-Unsubscribe: <https://example.net/>")
    assert with_fields(quoted, URL + "t/").startswith(b"List-Unsubscribe: <" + URL.encode() + b"t/>")


# -- the settings ------------------------------------------------------------------------


def test_a_channels_url_gets_its_slash_and_an_unsubscribe_lasts_ten_years_unless_told():
    settings = load({"UNSUBSCRIBE": {"newsletter": {"URL": URL.rstrip("/")}, "offers": {"URL": URL, "DURATION": 60}}})

    assert settings.unsubscribe == {
        "newsletter": ChannelUnsubscribe(url=URL, duration=timedelta(days=3650)),
        "offers": ChannelUnsubscribe(url=URL, duration=timedelta(seconds=60)),
    }
    assert load({}).unsubscribe == {}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (["newsletter"], "must be a dict of channel"),
        ({"news letter": {"URL": URL}}, "not a channel name: 'news letter'"),
        ({"newsletter": URL}, "must be a dict with a 'URL'"),
        ({"newsletter": {}}, "'URL'] must be the https:// URL"),
        ({"newsletter": {"URL": "http://www.example.com/u/"}}, "is not https://"),
        ({"newsletter": {"URL": "https:///u/"}}, "has no host name"),
        ({"newsletter": {"URL": "https://www.example.com/u/?c=1"}}, "has a query or a fragment"),
        ({"newsletter": {"URL": "https://www.exämple.com/u/"}}, "non-ASCII"),
        ({"newsletter": {"URL": URL, "MAILTO": "u@example.com"}}, "unknown keys 'MAILTO'"),
        ({"newsletter": {"URL": URL, "DURATION": 0}}, "'DURATION'] must be a timedelta"),
        ({"newsletter": {"URL": URL, "DURATION": timedelta(days=4000)}}, "at most 10 years"),
    ],
    ids=["list", "channel", "not-a-dict", "no-url", "http", "no-host", "query", "idn", "unknown-key", "zero", "long"],
)
def test_a_wrong_unsubscribe_setting_is_reported_with_its_check_id(value, words):
    problems = validate({"UNSUBSCRIBE": value})

    assert [p.id for p in problems] == ["bumail_queue.E034"]
    assert words in problems[0].message
    with pytest.raises(QueueConfigurationError, match="E034"):
        load({"UNSUBSCRIBE": value})


# -- the view ----------------------------------------------------------------------------


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request):
    """The ``BUMAIL_QUEUE`` keys of each store (the ORM store on this run's database)."""
    if request.param == "redis":
        return request.getfixturevalue("redis_settings")
    return {"STORE": request.param}


@pytest.fixture
def site(store_settings, monkeypatch):
    """The settings of a site with a newsletter channel, the view's clock at ``T0``."""
    monkeypatch.setattr(queue, "clock", lambda: T0)
    with override_settings(BUMAIL_QUEUE={"UNSUBSCRIBE": NEWSLETTER, **store_settings}):
        yield


@pytest.fixture
def provider():
    """A mailbox provider's client: no cookie, and CSRF checked as for a browser."""
    return Client(enforce_csrf_checks=True)


def path_of(channel, address):
    return url_of("/mail/unsubscribe/", channel, address)


def entries(**filters) -> list[Suppression]:
    return get_store().search_suppressions(now=T0, **filters)


def test_a_one_click_post_suppresses_that_recipient_for_that_channel_alone(site, provider):
    QueueService(clock=lambda: T0).suppress("bob@example.org")  # another address, for all mail

    with signals_told("unsubscribed") as told:
        response = provider.post(path_of("newsletter", "ann@example.org"), ONE_CLICK_BODY, content_type=FORM)

    assert response.status_code == 200  # no redirect: RFC 8058 §3.2
    assert not response.cookies  # no session made, nothing for the provider to keep
    assert b"will get no more" in response.content and b"ann@example.org" in response.content
    [entry] = entries(scope=channel_scope("newsletter"))
    assert (entry.address, entry.reason, entry.scope) == (
        "ann@example.org",
        SuppressionReason.UNSUBSCRIBED,
        "channel:newsletter",
    )
    assert (entry.created_at, entry.expires_at) == (T0, T0 + timedelta(days=3650))
    assert [e.address for e in entries(scope=GLOBAL_SCOPE)] == ["bob@example.org"]  # nothing for all mail
    assert told == [
        (
            "unsubscribed",
            {"item_id": None, "recipient": "ann@example.org", "source": "one-click", "channel": "newsletter"},
        )
    ]


def test_a_second_post_changes_nothing_more_and_answers_the_same(site, provider, monkeypatch):
    path = path_of("newsletter", "ann@example.org")
    first = provider.post(path, ONE_CLICK_BODY, content_type=FORM)
    before = entries()

    later = T0 + timedelta(days=2)
    monkeypatch.setattr(queue, "clock", lambda: later)  # the provider posts again two days on
    with signals_told("unsubscribed") as told:
        second = provider.post(path, ONE_CLICK_BODY, content_type=FORM)

    assert (second.status_code, second.content) == (first.status_code, first.content)
    assert len(before) == 1
    assert get_store().search_suppressions(now=later) == before  # not written again: the same times
    assert told == []  # the signal went once, with the unsubscribe


def test_the_confirmation_pages_button_posts_the_same(site):
    person = Client(enforce_csrf_checks=True)
    path = path_of("newsletter", "ann@example.org")

    page = person.get(path)
    assert page.status_code == 200
    assert entries() == []  # a GET changes nothing: scanners and previews follow every link
    html = page.content.decode()
    assert '<form method="post" action="">' in html and 'name="List-Unsubscribe" value="One-Click"' in html
    assert "csrfmiddlewaretoken" not in html and not page.cookies
    assert page["Cache-Control"].startswith("max-age=0") and page["Referrer-Policy"] == "no-referrer"

    done = person.post(path, {"List-Unsubscribe": "One-Click"})
    assert done.status_code == 200
    assert [(e.address, e.scope) for e in entries()] == [("ann@example.org", "channel:newsletter")]


def test_a_post_with_an_empty_body_unsubscribes_too(site, provider):
    # The token is the authority; a provider that posts no body is taken at its word.
    assert provider.post(path_of("newsletter", "ann@example.org")).status_code == 200
    assert [e.address for e in entries()] == ["ann@example.org"]


@pytest.mark.parametrize("method", ["get", "post"])
def test_a_forged_or_altered_token_is_refused_and_changes_nothing(site, provider, method):
    with override_settings(SECRET_KEY="an attacker's own key, long enough to look real"):
        forged = path_of("newsletter", "ann@example.org")
    token = make_token("newsletter", "ann@example.org")
    altered = "/mail/unsubscribe/" + _payload(["newsletter", "bob@example.org"]) + ":" + token.partition(":")[2] + "/"

    with signals_told("unsubscribed") as told:
        for path in (forged, altered, "/mail/unsubscribe/junk/"):
            response = provider.get(path) if method == "get" else provider.post(path, ONE_CLICK_BODY, content_type=FORM)
            assert response.status_code == 403
            assert b"This link is not valid" in response.content
            assert b"ann@example.org" not in response.content and b"bob@example.org" not in response.content

    assert entries() == [] and told == []


def test_other_methods_are_not_allowed(site, provider):
    response = provider.put(path_of("newsletter", "ann@example.org"), ONE_CLICK_BODY, content_type=FORM)
    assert response.status_code == 405
    assert entries() == []


def test_the_page_escapes_what_the_token_names(site, provider):
    # An address may quote '<' and '&' in its local part; the page shows them as text.
    path = path_of("newsletter", '"<b>ann&co</b>"@example.org')

    page = provider.get(path).content.decode()

    assert "<b>ann" not in page
    assert "&lt;b&gt;ann&amp;co&lt;/b&gt;" in page


def test_the_view_is_where_the_urls_say():
    from django.urls import reverse

    assert reverse("bumail_queue:unsubscribe", args=["t:s"]) == "/mail/unsubscribe/t:s/"


def test_a_store_that_is_down_answers_503_and_writes_nothing(provider, monkeypatch):
    monkeypatch.setattr(queue, "clock", lambda: T0)
    down = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"redis://127.0.0.1:{closed_port()}/0"}
    with (
        override_settings(
            CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}, "down": down}
        ),
        override_settings(BUMAIL_QUEUE={"UNSUBSCRIBE": NEWSLETTER, "STORE": "redis", "REDIS_CONNECTION": "down"}),
        signals_told("unsubscribed") as told,
    ):
        response = provider.post(path_of("newsletter", "ann@example.org"), ONE_CLICK_BODY, content_type=FORM)

    assert response.status_code == 503
    assert response["Retry-After"] == "300"
    assert b"nothing was changed" in response.content
    assert told == []


def test_a_channel_no_longer_in_unsubscribe_still_honours_its_links(store_settings, provider, monkeypatch):
    monkeypatch.setattr(queue, "clock", lambda: T0)
    with override_settings(BUMAIL_QUEUE=store_settings):
        assert provider.post(path_of("offers", "ann@example.org")).status_code == 200
        [entry] = entries()
    assert (entry.scope, entry.expires_at) == ("channel:offers", T0 + timedelta(days=3650))


def test_the_module_reads_no_database_to_check_a_token(django_assert_num_queries):
    token = make_token("newsletter", "ann@example.org")
    with django_assert_num_queries(0):
        assert list_unsubscribe.read_token(token) is not None


def _payload(value):
    """A token's payload part, as Django's signing writes it (URL-safe base64 of compact JSON)."""
    import json

    return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")
