"""``manage.py queue_suppression``: list, search, add, remove and purge, on every store."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from bumail_queue import queue
from bumail_queue.addresses import normal_address
from bumail_queue.items import Reply
from bumail_queue.stores import get_store
from bumail_queue.suppression import Suppression, SuppressionChange, SuppressionReason
from tests.helpers import ROOT, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["orm", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_name(request):
    store = request.getfixturevalue("redis_settings") if request.param == "redis" else {"STORE": request.param}
    with override_settings(BUMAIL_QUEUE={"HOSTNAME": "mta.example.com", **store}):
        yield request.param


def bounced(address, *, minutes_ago=0, lasts=timedelta(days=30)):
    """Put ``address`` on the list as the worker does after a 550 5.1.1."""
    at = timezone.now() - timedelta(minutes=minutes_ago)
    entry = Suppression(
        address=normal_address(address),
        reason=SuppressionReason.FAILED,
        reply=Reply(code=550, status="5.1.1", text="5.1.1 User unknown"),
        created_at=at,
        expires_at=at + lasts,
    )
    get_store().update_suppressions(SuppressionChange(add=(entry,)), now=at)
    return entry


def run(*args):
    out, err = StringIO(), StringIO()
    call_command("queue_suppression", *args, stdout=out, stderr=err)
    return out.getvalue().splitlines(), err.getvalue().splitlines()


def test_list_shows_each_entry_with_its_reply_and_expiry_the_newest_first(store_name):
    old = bounced("old@example.org", minutes_ago=5)
    new = bounced("new@example.org")

    lines, _ = run("list")

    assert lines == [
        f"new@example.org  failed  since {new.created_at:%Y-%m-%d %H:%M} until {new.expires_at:%Y-%m-%d %H:%M UTC}  "
        "550 5.1.1 User unknown",
        f"old@example.org  failed  since {old.created_at:%Y-%m-%d %H:%M} until {old.expires_at:%Y-%m-%d %H:%M UTC}  "
        "550 5.1.1 User unknown",
        "2 addresses suppressed.",
    ]


def test_list_searches_and_stops_at_its_limit(store_name):
    for n in range(3):
        bounced(f"m{n}@example.org", minutes_ago=n)
    bounced("other@example.net")

    found, _ = run("list", "--search", "@EXAMPLE.ORG", "--limit", "2")
    assert [line.split()[0] for line in found[:2]] == ["m0@example.org", "m1@example.org"]
    assert found[2:] == ["(more than 2; --limit to show more)"]
    assert run("list", "--search", "nobody") == (["No suppressed address matches."], [])


def test_list_of_an_empty_list_and_as_json(store_name):
    assert run("list") == (["The suppression list is empty."], [])
    entry = bounced("gone@example.org")

    data = json.loads("\n".join(run("list", "--json")[0]))

    assert data == {
        "total": 1,
        "more": False,
        "entries": [
            {
                "address": "gone@example.org",
                "forgotten": False,
                "scope": "",
                "reason": "failed",
                "reply": {"code": 550, "status": "5.1.1", "text": "5.1.1 User unknown"},
                "created_at": entry.created_at.isoformat(),
                "expires_at": entry.expires_at.isoformat(),
            }
        ],
    }


def test_add_suppresses_addresses_in_their_normal_form_with_a_note_for_a_while(store_name):
    lines, _ = run("add", "Ann@Bücher.example", "bob@example.org", "--note", "asked us to stop", "--for", "2w")

    entries = queue.suppressed(["Ann@xn--bcher-kva.example", "bob@example.org"])
    assert [(e.address, e.reason, e.reply.text) for e in entries.values()] == [
        ("Ann@xn--bcher-kva.example", SuppressionReason.MANUAL, "asked us to stop"),
        ("bob@example.org", SuppressionReason.MANUAL, "asked us to stop"),
    ]
    ann = entries["Ann@xn--bcher-kva.example"]
    assert ann.expires_at - ann.created_at == timedelta(weeks=2)
    assert lines[0] == f"Suppressed Ann@xn--bcher-kva.example until {ann.expires_at:%Y-%m-%d %H:%M UTC}."


def test_add_without_for_lasts_suppression_duration():
    with override_settings(BUMAIL_QUEUE={"STORE": "memory", "SUPPRESSION_DURATION": timedelta(days=3)}):
        run("add", "gone@example.org")
        [entry] = queue.suppressed(["gone@example.org"]).values()
    assert entry.expires_at - entry.created_at == timedelta(days=3)


def test_add_refuses_what_is_no_address(store_name):
    with pytest.raises(CommandError, match=r"^'not-an-address' cannot be suppressed: it has no @\.$"):
        run("add", "not-an-address")
    assert queue.count_suppressions() == 0


def test_remove_takes_addresses_off_and_names_those_that_were_not_on(store_name):
    bounced("gone@xn--bcher-kva.example")
    bounced("kept@example.org")

    with pytest.raises(SystemExit) as exited:
        run("remove", "gone@BÜCHER.example", "never@example.org")

    assert exited.value.code == 1
    assert queue.suppressed(["gone@xn--bcher-kva.example", "kept@example.org"]).keys() == {"kept@example.org"}
    assert run("remove", "kept@example.org") == (["Removed 1 address from the suppression list."], [])


def test_remove_domain_takes_every_address_at_it_and_no_other(store_name):
    for address in ("a@outage.example", "b@OUTAGE.example", "c@mail.outage.example", "d@outage.example.net"):
        bounced(address)

    assert run("remove", "--domain", "Outage.Example.") == (["Removed 2 addresses from the suppression list."], [])
    left = sorted(e.address for e in queue.search_suppressions())
    assert left == ["c@mail.outage.example", "d@outage.example.net"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), r"^Give the addresses to remove, or --domain, not both\.$"),
        (("a@example.org", "--domain", "example.org"), r"^Give the addresses to remove, or --domain, not both\.$"),
        (("--domain", "exa mple.org"), r"^'exa mple\.org' is not a domain: "),
    ],
)
def test_remove_refuses_unclear_arguments(store_name, args, said):
    with pytest.raises(CommandError, match=said):
        run("remove", *args)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("add",), r"^Give the addresses to suppress\.$"),
        (("list", "a@example.org"), r"^list takes no address; to find one: list --search TEXT\.$"),
        (("purge", "a@example.org"), r"^purge takes no address"),
    ],
)
def test_each_action_takes_what_it_needs(store_name, args, said):
    with pytest.raises(CommandError, match=said):
        run(*args)


def test_purge_drops_what_expired(store_name):
    bounced("new@example.org")
    # Added last: an add drops a hundred expired entries on its way (on the ORM and Redis stores).
    bounced("old@example.org", minutes_ago=120, lasts=timedelta(hours=1))

    assert run("purge") == (["Dropped 1 expired entry."], [])
    assert run("purge") == (["Dropped 0 expired entries."], [])
    assert [e.address for e in queue.search_suppressions()] == ["new@example.org"]


@pytest.mark.slow
def test_on_the_command_line_an_address_not_on_the_list_is_a_line_of_its_own_and_status_1():
    settings = {"HOSTNAME": "mta.example.com"}
    with override_settings(BUMAIL_QUEUE=settings):
        bounced("gone@example.org")
    done = subprocess.run(
        [sys.executable, "-m", "django", "queue_suppression", "remove", "gone@example.org", "never@example.org"],
        cwd=ROOT, env=worker_env(settings), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "Removed 1 address from the suppression list.\n",
        "never@example.org is not suppressed.\n",
    )


def test_export_then_import_brings_the_list_back_with_its_reasons_replies_and_times(store_name, tmp_path):
    gone = bounced("gone@example.org", minutes_ago=5)
    note = queue.suppress("Ann@Example.org", note='asked us to stop, "twice"\nby phone')
    lines, _ = run("export")
    assert lines[0] == "address,reason,created_at,expires_at,reply_code,reply_status,reply_text,scope"
    exported = tmp_path / "list.csv"
    exported.write_text("\n".join(lines) + "\n", encoding="utf-8")
    queue.unsuppress(["gone@example.org", "Ann@example.org"])
    assert queue.count_suppressions() == 0

    assert run("import", str(exported)) == (["Imported 2 entries."], [])
    assert {e.address: e for e in queue.search_suppressions()} == {"gone@example.org": gone, "Ann@example.org": note}


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        (["nobody,failed,2026-03-01T09:00:00+00:00,2999-01-01T00:00:00+00:00,,,x"], r"first line must be the columns"),
        (
            ["address,reason,created_at,expires_at,reply_code,reply_status,reply_text",
             "a@example.org,failed,2026-03-01T09:00:00+00:00,2999-01-01T00:00:00+00:00,550,5.1.1,gone",
             "b@example.org,lost,2026-03-01T09:00:00+00:00,2999-01-01T00:00:00+00:00,,,"],
            r"line 3 is no entry",
        ),
        (
            ["address,reason,created_at,expires_at,reply_code,reply_status,reply_text",
             "a@example.org,failed,2026-03-01T09:00:00+00:00,2999-01-01T00:00:00+00:00,550,5.1.1,gone",
             "old@example.org,failed,2020-03-01T09:00:00+00:00,2020-04-01T00:00:00+00:00,550,5.1.1,gone"],
            r"'old@example.org' cannot be suppressed: its entry expired",
        ),
        (
            ["address,reason,created_at,expires_at,reply_code,reply_status,reply_text",
             "not an address,manual,2026-03-01T09:00:00+00:00,2999-01-01T00:00:00+00:00,,,"],
            r"'not an address' cannot be suppressed",
        ),
    ],
)  # fmt: skip
def test_import_of_a_file_with_a_wrong_line_says_which_and_imports_nothing(store_name, tmp_path, rows, said):
    source = tmp_path / "list.csv"
    source.write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(CommandError, match=said):
        run("import", str(source))
    assert queue.count_suppressions() == 0


def test_import_needs_one_file(store_name):
    with pytest.raises(CommandError, match=r"Give the CSV file to import"):
        run("import")
    with pytest.raises(CommandError, match=r"Cannot read /nonexistent/list.csv"):
        run("import", "/nonexistent/list.csv")


def test_a_channel_scope_is_added_listed_and_removed_apart_from_all_mail(store_name):
    bounced("ann@example.org", minutes_ago=1)

    lines, _ = run("add", "ann@example.org", "--channel", "newsletter", "--note", "asked")
    (left,) = [e for e in queue.suppressions_for("ann@example.org") if e.scope]
    assert lines == [f"Suppressed ann@example.org for channel:newsletter until {left.expires_at:%Y-%m-%d %H:%M UTC}."]

    listed, _ = run("list", "--channel", "newsletter")
    assert listed == [
        f"ann@example.org  channel:newsletter  manual  since {left.created_at:%Y-%m-%d %H:%M} "
        f"until {left.expires_at:%Y-%m-%d %H:%M UTC}  asked"
    ]
    assert [line.split()[1] for line in run("list", "--reason", "failed")[0]] == ["failed"]

    assert run("remove", "ann@example.org", "--channel", "newsletter")[0] == [
        "Removed 1 address from the suppression list."
    ]
    assert [e.scope for e in queue.suppressions_for("ann@example.org")] == [""]
    with pytest.raises(CommandError, match="--channel must be a name"):
        run("add", "ann@example.org", "--channel", "no spaces")


def test_show_and_forget_cover_every_scope_of_an_address(store_name):
    bounced("ann@example.org")
    queue.suppress("ann@example.org", scope="channel:newsletter", reason=SuppressionReason.UNSUBSCRIBED)
    queue.suppress("bob@example.org")

    shown, _ = run("show", "ann@example.org", "nobody@example.org")
    assert [line.split("  ")[:3] for line in shown[:2]] == [
        ["ann@example.org", "failed", shown[0].split("  ")[2]],
        ["ann@example.org", "channel:newsletter", "unsubscribed"],
    ]
    assert shown[2] == "nobody@example.org is not suppressed."
    as_json = json.loads("\n".join(run("show", "ann@example.org", "--json")[0]))
    assert [entry["scope"] for entry in as_json["ann@example.org"]] == ["", "channel:newsletter"]

    forgot, _ = run("forget", "ann@example.org", "nobody@example.org")
    assert forgot == [
        "Forgot ann@example.org: 2 entries (all mail, channel:newsletter).",
        "Forgot nobody@example.org: 0 entries.",
    ]
    assert queue.suppressions_for("ann@example.org") == []
    assert [e.address for e in queue.search_suppressions()] == ["bob@example.org"]


def test_export_keeps_scopes_and_an_export_without_them_imports_as_all_mail(store_name, tmp_path):
    queue.suppress("ann@example.org", scope="channel:newsletter", reason=SuppressionReason.UNSUBSCRIBED)
    lines, _ = run("export")
    assert lines[1].startswith("ann@example.org,unsubscribed,") and lines[1].endswith(",channel:newsletter")
    (tmp_path / "scoped.csv").write_text("\n".join(lines) + "\n")
    queue.forget_suppressions("ann@example.org")
    run("import", str(tmp_path / "scoped.csv"))
    assert [e.scope for e in queue.suppressions_for("ann@example.org")] == ["channel:newsletter"]

    later = (timezone.now() + timedelta(days=3)).isoformat()
    (tmp_path / "old.csv").write_text(
        "address,reason,created_at,expires_at,reply_code,reply_status,reply_text\n"
        f"bob@example.org,manual,{timezone.now().isoformat()},{later},,,from before scopes\n"
    )
    assert run("import", str(tmp_path / "old.csv"))[0] == ["Imported 1 entry."]
    assert [e.scope for e in queue.suppressions_for("bob@example.org")] == [""]
