"""Who may read the queue's gauges from the web process; the metrics' settings and
checks; and the queue without prometheus-client installed."""

from __future__ import annotations

import importlib
import sys

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bumail_queue.checks import check_metrics_installed, check_settings
from bumail_queue.conf import load, validate
from bumail_queue.metrics.worker import OTHER_DOMAIN, WorkerMetrics

pytestmark = pytest.mark.django_db

URL = "/metrics/queue/"
TOKEN = "s3cret-metrics-token-0123456789"


def families(response) -> set[str]:
    return {family.name for family in text_string_to_metric_families(response.content.decode())}


@pytest.fixture
def with_token():
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", "METRICS_TOKEN": TOKEN}):
        yield


def test_prometheus_with_the_token_reads_the_gauges(client, with_token):
    response = client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "no-cache" in response["Cache-Control"]
    assert {"bumail_queue_items", "bumail_queue_store_up", "bumail_queue_oldest_item_age_seconds"} <= families(response)
    # Only the queue's gauges: the web process's own are no business of the queue.
    assert not any(name.startswith(("process_", "python_")) for name in families(response))


def test_prometheus_may_ask_for_openmetrics(client, with_token):
    response = client.get(
        URL, headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.endswith(b"# EOF\n")


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-token-wrong-token-00", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer é"]
)
def test_anyone_else_is_asked_for_the_token(client, with_token, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = client.get(URL, headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="bumail_queue metrics"'
    assert TOKEN.encode() not in response.content


def test_without_a_token_set_no_bearer_is_let_in(client):
    assert client.get(URL, headers={"Authorization": "Bearer None"}).status_code == 401
    assert client.get(URL, headers={"Authorization": "Bearer "}).status_code == 401


def staff(*, is_staff=True, permission=True) -> User:
    user = User.objects.create_user("ops", "ops@example.com", "pw", is_staff=is_staff)
    if permission:
        user.user_permissions.add(Permission.objects.get(codename="view_item", content_type__app_label="bumail_queue"))
    return user


def test_staff_who_may_see_the_queue_read_the_gauges_in_a_browser(client):
    client.force_login(staff())
    response = client.get(URL)
    assert response.status_code == 200
    assert "bumail_queue_items" in families(response)


@pytest.mark.parametrize(("is_staff", "permission"), [(True, False), (False, True), (False, False)])
def test_other_users_are_refused(client, is_staff, permission):
    client.force_login(staff(is_staff=is_staff, permission=permission))
    response = client.get(URL)
    assert response.status_code == 403
    assert b"view_item" in response.content


def test_only_get_is_served(client, with_token):
    assert client.post(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405


# -- settings -------------------------------------------------------------------------------


def test_metrics_domains_are_kept_in_the_form_domains_are_compared_in():
    settings = load({"METRICS_DOMAINS": ["Gmail.com", "bücher.example.", "gmail.com"]})
    assert settings.metrics_domains == frozenset({"gmail.com", "xn--bcher-kva.example"})
    metrics = WorkerMetrics(registry=CollectorRegistry(), domains=settings.metrics_domains)
    assert metrics.domain_label("ann@GMAIL.COM") == "gmail.com"
    assert metrics.domain_label("ann@Bücher.example") == "xn--bcher-kva.example"
    assert metrics.domain_label("ann@mail.gmail.com") == OTHER_DOMAIN
    assert WorkerMetrics(registry=CollectorRegistry()).domain_label("a@gmail.com") == OTHER_DOMAIN


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("gmail.com", "must be a list of recipient domains"),
        (["gmail.com", "not a domain", 3], "these are not: 'not a domain', 3"),
        (["127.0.0.1"], "these are not: '127.0.0.1'"),
        ([f"d{n}.example" for n in range(51)], "at most 50 may have a label of their own"),
    ],
)
def test_metrics_domains_that_are_not_a_short_list_of_domains_are_refused(value, says):
    [problem] = validate({"METRICS_DOMAINS": value})
    assert (problem.id, problem.key) == ("bumail_queue.E026", "METRICS_DOMAINS")
    assert says in problem.message


@pytest.mark.parametrize(
    "token", ["short", "has a space in it, sixteen+", 1234567890123456789, "ünïcode-token-0123456789"]
)
def test_a_metrics_token_that_is_guessable_or_not_a_header_value_is_refused_and_never_repeated(token):
    with override_settings(BUMAIL_QUEUE={"METRICS_TOKEN": token}):
        [error] = check_settings()
    assert error.id == "bumail_queue.E026"
    assert "at least 16 printable ASCII characters" in error.msg
    assert str(token) not in error.msg


def test_a_metrics_setting_without_prometheus_client_installed_is_a_warning(monkeypatch):
    with override_settings(BUMAIL_QUEUE={"METRICS_DOMAINS": ["gmail.com"]}):
        assert check_metrics_installed() == []
        monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
        [warning] = check_metrics_installed()
    assert warning.id == "bumail_queue.W007"
    assert "pip install 'bumail_queue[prometheus]'" in warning.msg
    with override_settings(BUMAIL_QUEUE={}):
        assert check_metrics_installed() == []


# -- without prometheus-client, and the command's mistakes ---------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_queue_runs_without_prometheus_client_and_asking_for_metrics_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    for name in [m for m in sys.modules if m.startswith("bumail_queue.metrics.")]:
        monkeypatch.delitem(sys.modules, name)
    call_command("queue_worker", "--burst", verbosity=0)  # no metrics asked for: runs
    with pytest.raises(CommandError, match=r"pip install 'bumail_queue\[prometheus\]'"):
        call_command("queue_worker", "--burst", "--metrics-port", "0", verbosity=0)
    with pytest.raises(ImproperlyConfigured, match=r"need prometheus-client, which is not installed"):
        importlib.import_module("bumail_queue.metrics.views")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--metrics-address", "127.0.0.1"], "--metrics-address goes with --metrics-port"),
        (["--no-queue-gauges"], "--no-queue-gauges goes with --metrics-port"),
        (["--metrics-port", "70000"], "must be a port number from 0"),
        (["--metrics-port", "0", "--metrics-address", "localhost"], "is not an IP address"),
    ],
)
def test_metrics_options_that_make_no_sense_are_refused(args, says):
    with pytest.raises(CommandError, match=says):
        call_command("queue_worker", "--burst", *args, verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_a_metrics_port_taken_stops_the_worker_before_it_starts():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            CommandError, match=rf"Cannot serve metrics on 127.0.0.1 port {port}: Address already in use"
        ):
            call_command("queue_worker", "--burst", "--metrics-port", str(port), verbosity=0)
