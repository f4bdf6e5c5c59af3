"""An action on all the items matching the queue list's filter, in Chromium: filter the
list, select every row, choose "all matching" (the admin's own ``actions.js``), read
the confirmation page, confirm, and find the result in the list and in the audit.

It changes the sample queue (it holds, then releases, the mail to ``example.net``), so
it runs after ``test_admin_browser.py``, whose tests read that mail as seeded.
"""

from __future__ import annotations

import pytest

from .test_admin_browser import LIST, assert_sidebar_open

pytestmark = pytest.mark.browser

AUDIT = "/admin/bumail_queue/bulkaction/"


def choose_all_matching(page, action):
    """On a filtered list: select every row, then all the matching items, then ``action``."""
    page.locator("#action-toggle").check()
    question = page.locator("#bq-select-across")
    question.wait_for()  # shown by actions.js once every row of the page is selected
    text = question.inner_text()
    question.click()
    assert page.locator(".actions span.all").is_visible()
    assert page.locator("input.select-across").input_value() == "1"
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # the actions bar fits
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")
    return text


def test_hold_then_release_all_the_mail_to_a_domain(page, screenshot):
    page.goto(LIST + "?domain=example.net")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 4  # one of them is being delivered
    assert choose_all_matching(page, "hold") == "Select all 4 items matching this filter"

    page.wait_for_selector("#bq-confirm-bulk")
    assert_sidebar_open(page)
    assert page.locator("h1").inner_text() == "Hold all 3 items matching: domain example.net"
    assert "1 more item matches but is being delivered right now" in page.locator("#content-main").inner_text()
    sample = page.locator("#bq-bulk-sample").inner_text()
    assert "Weekly digest: 5 new articles" in sample and "gina@example.net" in sample
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    screenshot(page, "admin-bulk-confirmation.png")

    page.click("#bq-confirm-bulk")
    page.wait_for_selector(".messagelist")
    assert page.locator(".messagelist").inner_text().strip() == (
        "Held 3 items; 1 was being delivered (or changed meanwhile) and was left alone."
    )
    assert "domain=example.net" in page.url  # back to the list, its filter kept
    assert page.locator("#result_list tbody tr", has_text="Held").count() == 3

    page.goto(LIST + "?domain=example.net&state=held")
    choose_all_matching(page, "release")
    page.wait_for_selector("#bq-confirm-bulk")
    assert page.locator("h1").inner_text() == "Release all 3 held items matching: domain example.net, state held"
    page.click("#bq-confirm-bulk")
    page.wait_for_selector(".messagelist")
    assert page.locator(".messagelist").inner_text().strip() == "Released 3 items."
    assert "No queued item matches." in page.locator("#changelist").inner_text()

    page.click("text=Bulk actions")
    page.wait_for_url("**" + AUDIT)
    audit = page.locator("#result_list tbody tr")
    assert audit.count() == 2
    assert "domain example.net, state held" in audit.first.inner_text()  # the newest first
    assert "operator" in audit.nth(1).inner_text()


def test_going_back_from_the_confirmation_page_changes_nothing(page):
    page.goto(LIST + "?domain=example.org&state=deferred")
    before = page.locator("#result_list tbody").inner_text()
    choose_all_matching(page, "cancel")
    page.wait_for_selector("#bq-confirm-bulk")
    assert page.locator("h1").inner_text().startswith("Cancel ")
    page.click("#bq-bulk-back")
    page.wait_for_selector("#result_list")
    assert "domain=example.org" in page.url
    assert page.locator("#result_list tbody").inner_text() == before
