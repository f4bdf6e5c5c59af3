"""The queue's admin pages in Chromium, as an operator uses them.

Run with ``tox -e browser`` (or ``python -m pytest -m browser``); set
``BUMAIL_SCREENSHOTS=1`` to refresh the screenshots in ``docs/images/``.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.browser

LIST = "/admin/bumail_queue/item/"
LOG = "/admin/bumail_queue/deliverylog/"
LONG_SUBJECT = "Your monthly statement for account 4417-2231-0098 is ready"

#: Where the page, the result table, the filter panel and each column header are; whether
#: the table scrolls inside its box (the admin's ``.results`` scrolls sideways, so a list
#: too wide for the page hides under the filter panel without the page scrolling), and
#: whether any header's text is cut.
LAYOUT = """() => {
    const box = (el) => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right}; };
    const table = document.querySelector("#result_list");
    const filter = document.querySelector("#changelist-filter");
    const results = table.closest(".results");
    return {
        scrollWidth: document.documentElement.scrollWidth,
        innerWidth: window.innerWidth,
        resultsScroll: [results.scrollWidth, results.clientWidth],
        table: box(table),
        filter: filter ? box(filter) : null,
        headers: [...table.querySelectorAll("thead th")].map((th) => ({
            text: th.innerText.trim(), ...box(th), cut: th.scrollWidth > th.clientWidth,
        })),
    };
}"""


def open_item(page, subject):
    page.click(f"#result_list a:has-text('{subject}')")
    page.wait_for_selector("#bq-recipients")


def assert_sidebar_open(page):
    assert page.evaluate("localStorage.getItem('django.admin.navSidebarIsOpen')") in (None, "true")
    assert page.locator("#nav-sidebar").is_visible()
    assert "shifted" in (page.locator("#main").get_attribute("class") or "")  # nav_sidebar.js: open


def assert_fits(page, columns):
    """The list at 1280 px beside the open sidebar: no horizontal scrolling, the table
    left of the filter panel, and every column header whole and in view."""
    layout = page.evaluate(LAYOUT)
    assert layout["innerWidth"] == 1280
    assert layout["scrollWidth"] <= layout["innerWidth"], layout
    assert layout["resultsScroll"][0] <= layout["resultsScroll"][1], layout
    assert layout["table"]["right"] <= layout["innerWidth"], layout
    assert layout["table"]["right"] <= layout["filter"]["left"], layout
    headers = {h["text"].lower(): h for h in layout["headers"]}
    for column in columns:
        header = headers[column.lower()]
        assert 0 <= header["left"] < header["right"] <= layout["filter"]["left"], (column, layout)
        assert not header["cut"], (column, layout)


def test_the_lists_fit_1280_px_with_the_sidebar_open(page, screenshot):
    page.goto(LIST)
    assert_sidebar_open(page)
    long_row = page.locator("#result_list tbody tr", has_text=LONG_SUBJECT)
    assert long_row.count() == 1
    assert "and 1 more" in long_row.inner_text()
    # A subject cut short says the whole of itself in its title.
    assert LONG_SUBJECT in long_row.locator("th.field-subject a").get_attribute("title")
    assert_fits(page, ["Subject", "Sender", "Recipients", "State", "Attempts", "Next attempt", "Age"])

    page.goto(LOG)
    assert_sidebar_open(page)
    assert page.locator("#result_list tbody tr", has_text="NotAuthorizedError").count() >= 1
    assert_fits(page, ["Logged at", "Recipient", "Status", "Reply", "Remote host", "Item"])
    screenshot(page, "admin-log.png")


def test_find_an_item_by_recipient_and_read_it(page, screenshot):
    page.goto(LIST)
    assert page.locator("#result_list tbody tr").count() >= 8
    assert_sidebar_open(page)  # as an operator sees it first: the screenshot too
    screenshot(page, "admin-list.png")

    page.fill("#searchbar", "alice@example.org")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=alice*")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "Deferred" in rows.first.inner_text()
    assert "451 4.7.1" in rows.first.inner_text()

    open_item(page, "Your order #1042 has shipped")
    recipient = page.locator("#bq-recipients tr[data-recipient='alice@example.org']")
    assert "deferred" in recipient.inner_text()
    assert "451 4.7.1 Greylisted, please try again in 5 minutes" in recipient.inner_text()
    assert "mx1.example.org" in recipient.inner_text()
    assert "Greylisted" in page.locator("#bq-history").inner_text()

    # The HTML body is shown, sanitised, in a sandboxed frame: the mail's script never runs.
    frame = page.frame_locator("iframe.bq-preview")
    assert "Your order #1042 has shipped" in frame.locator("h1").first.inner_text()
    assert frame.locator("#pwned").count() == 0
    assert frame.locator("script").count() == 0
    assert "pwned" not in page.title()
    assert page.url.startswith("http://127.0.0.1:")  # no onerror sent the page anywhere
    assert page.locator("iframe.bq-preview").get_attribute("sandbox") == ""
    assert "Trail running shoes" in frame.locator("body").inner_text()
    # The tracking pixel is refused by the frame's Content-Security-Policy, not fetched.
    blocked = [e for e in page.js_errors if "tracker.example.com" in e and "Content Security Policy" in e]
    assert blocked
    page.js_errors[:] = [e for e in page.js_errors if e not in blocked]
    # The whole page at once, its frame painted (a full-page capture can leave it blank).
    page.set_viewport_size({"width": 1280, "height": page.evaluate("document.documentElement.scrollHeight")})
    frame.locator("h1").first.wait_for()
    screenshot(page, "admin-item.png")


def test_the_list_says_how_many_items_are_in_the_queue(page):
    page.goto(LIST)
    rows = page.locator("#result_list tbody tr").count()
    assert 1 < rows < 100  # the whole queue on one page, so the count is every row's
    footer = page.locator("p.bq-paginator span.bq-muted").inner_text().strip()
    assert footer == f"{rows} items in the queue"


def test_retry_one_item(page):
    page.goto(LIST + "?state=deferred")
    row = page.locator("#result_list tbody tr", has_text="Invoice 2026-114")
    row.locator("input.action-select").check()
    assert "1 of" in page.locator(".action-counter").inner_text()  # the admin's own actions.js
    page.select_option("select[name=action]", "retry_now")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert page.locator(".messagelist").inner_text().strip() == "1 item retried."
    page.goto(LIST + "?q=billing%40customer")
    assert "due now" in page.locator("#result_list tbody tr").first.inner_text()


def test_cancel_one_item_through_the_confirmation_page(page):
    page.goto(LIST + "?q=iris%40example.com")
    page.locator("#result_list tbody tr input.action-select").first.check()
    page.select_option("select[name=action]", "cancel")
    page.click("button[name=index]")
    page.wait_for_selector("#bq-confirm-cancel")
    assert "Cancel this item?" in page.locator("#content-main").inner_text()
    assert "iris@example.com" in page.locator("#bq-cancel-list").inner_text()
    page.click("#bq-confirm-cancel")
    page.wait_for_selector(".messagelist")
    assert page.locator(".messagelist").inner_text().strip() == "1 item cancelled."
    assert "No queued item matches." in page.locator("#changelist").inner_text()


def test_cancel_from_the_item_page_can_be_taken_back(page):
    page.goto(LIST + "?q=hugo%40example.org")
    open_item(page, "Welcome to Shop Example, Hugo")
    page.click("#bq-cancel")
    page.wait_for_selector("#bq-confirm-cancel")
    page.click("text=No, take me back")
    page.wait_for_selector("#bq-recipients")
    assert "hugo@example.org" in page.locator("#bq-recipients").inner_text()


def test_the_overview_draws_the_queue(page, screenshot):
    page.goto(LIST + "overview/")
    counts = page.locator("#bq-counts").inner_text()
    assert re.search(r"\d+\s*Being delivered", counts)
    assert page.locator("#bq-shape tr[data-domain='example.org']").count() == 1
    assert page.locator("svg.bq-bar rect").count() >= 2
    screenshot(page, "admin-overview.png")


def test_the_page_of_an_address_from_the_suppression_list(page, screenshot):
    page.goto("/admin/bumail_queue/suppression/add/")
    page.fill("input[name=address]", "alice@example.org")
    page.fill("input[name=note]", "Asked for no newsletter by phone")
    page.fill("input[name=channel]", "newsletter")
    page.click(".submit-row input[type=submit]")
    page.wait_for_selector("tr[data-address='alice@example.org']")

    page.click("tr[data-address='alice@example.org'] a.bq-address")
    page.wait_for_selector("#bq-address-items")
    assert_sidebar_open(page)
    assert page.locator("h1").inner_text() == "Mail to alice@example.org"
    assert "channel:newsletter" in page.locator("#bq-address-suppressions").inner_text()
    assert "Your order #1042 has shipped" in page.locator("#bq-address-items").inner_text()
    assert "Greylisted" in page.locator("#bq-address-log").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    screenshot(page, "admin-address.png")

    page.click("#bq-address-suppressions button.bq-remove")
    page.wait_for_selector("#bq-not-suppressed")
    assert "1 suppression entry removed." in page.locator(".messagelist").inner_text()
