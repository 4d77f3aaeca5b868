"""The status page (`--status-addr`) in a real browser: Debian's Chromium, headless,
driven through its ChromeDriver. The state it must show is made with this package's
client against the tests' cluster: a lock with two waiters, a semaphore at its limit
with a waiter, an election. The assertions are on the rendered page, as an operator
reads it; the lock's release must reach the page without a reload.

A screenshot is saved in the cluster's directory (and to LEASEHOLD_SCREENSHOT when
set, as the README's picture is made)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

import leasehold
from cluster import LocalCluster
from waiting import until

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = pytest.mark.cluster

CHROMIUM = os.environ.get("LEASEHOLD_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("LEASEHOLD_CHROMEDRIVER", "/usr/bin/chromedriver")
#: How long the page may take to show a change: it polls once a second.
PAGE_WAIT_S = 15.0


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    for program in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(program), f"{program} is missing: scripts/setup.sh installs chromium and chromium-driver"
    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1300"):
        options.add_argument(argument)
    # The nodes' certificate is from the test cluster's own CA, which this browser
    # profile does not know; the page is still served over TLS.
    options.accept_insecure_certs = True
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def page_url(cluster: LocalCluster, node_id: int) -> str:
    return f"https://{cluster.nodes[node_id].status_addr}/"


def sign_in(browser: WebDriver, url: str, token: str) -> None:
    browser.get(url)
    browser.execute_script("sessionStorage.clear()")
    browser.get(url)
    WebDriverWait(browser, PAGE_WAIT_S).until(lambda _: browser.find_element(By.ID, "login").is_displayed())
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()


#: One table row as the page shows it now, read in one call (the page replaces its
#: rows at each refresh, so an element found earlier may be gone when it is read).
ROW_NOW = """
const [table, key, value] = arguments;
for (const tr of document.querySelectorAll(`table#${table} tbody tr`)) {
  if (tr.dataset[key] !== value) continue;
  const text = (selector) => { const found = tr.querySelector(selector); return found ? found.textContent : null; };
  const badge = tr.querySelector("td.held .badge");
  return {
    holder: text("td.holder"), token: text("td.token"), leader: text("td.leader"), value: text("td.value"),
    held: badge ? badge.textContent : null, held_class: badge ? badge.className : "",
    waiters: [...tr.querySelectorAll("td.waiters li.waiter")].map((item) => item.textContent),
    cells: [...tr.querySelectorAll("td")].map((cell) => cell.textContent),
  };
}
return null;
"""

#: The rows of a table: the value of `key` in each row's data, in order.
ROW_KEYS = """
const [table, key] = arguments;
return [...document.querySelectorAll(`table#${table} tbody tr`)].map((tr) => tr.dataset[key]);
"""


def row(
    browser: WebDriver,
    table: str,
    name: str,
    shows: Callable[[dict], bool] = lambda _: True,
    reason: str = "",
    key: str = "name",
) -> dict:
    """The row of `name` in `table`, once the page shows it (and `shows` holds)."""

    def shown(_: WebDriver) -> object:
        found = browser.execute_script(ROW_NOW, table, key, name)
        return found if found is not None and shows(found) else False

    return WebDriverWait(browser, PAGE_WAIT_S).until(shown, reason or f"the page to show {name} in the {table} table")


def row_keys(browser: WebDriver, table: str, key: str) -> List[str]:
    return browser.execute_script(ROW_KEYS, table, key)


def in_background(work: Callable[[], object]) -> threading.Thread:
    """Runs a waiting acquire on a thread; the wait ends with its session when the
    test closes its clients."""

    def run() -> None:
        try:
            work()
        except leasehold.SessionLost:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_page_shows_holders_waiters_limits_and_leaders_and_follows_a_release(
    cluster: LocalCluster, browser: WebDriver
) -> None:
    # Names no other test uses (the cluster is shared), short for the screenshot. The
    # test cluster watches cron/* (cluster.py): the page lists what it saw.
    lock_name, semaphore_name, election_name = "page/orders/42", "page/reports-tenant-a", "cron/weekly-report"
    admin_token = cluster.admin_token_file.read_text().splitlines()[0].strip()
    leader = cluster.wait_for_leader()
    with cluster.client(client_name="payments-worker-a") as worker_a, cluster.client(
        client_name="payments-worker-b"
    ) as worker_b, cluster.client(client_name="payments-worker-c") as worker_c:
        holder, second, third = worker_a.session(ttl=30), worker_b.session(ttl=30), worker_c.session(ttl=30)
        held = holder.lock(lock_name, wait=10)
        granted: dict = {}
        # B queues first, C after it: the page must show them in that order.
        waiting_b = in_background(lambda: granted.__setitem__("b", second.lock(lock_name, wait=60)))
        until(10, "B to wait on the lock", lambda: len(worker_a.describe_lock(lock_name).waiters) == 1)
        waiting_c = in_background(lambda: granted.__setitem__("c", third.lock(lock_name, wait=60)))
        until(10, "C to wait behind B", lambda: len(worker_a.describe_lock(lock_name).waiters) == 2)

        permits = [session.semaphore(semaphore_name, 2).acquire(wait=10) for session in (holder, second)]
        in_background(lambda: third.semaphore(semaphore_name, 2).acquire_within(60))
        until(10, "C to wait for a permit", lambda: len(worker_a.describe_semaphore(semaphore_name).waiters) == 1)
        leadership = holder.campaign(election_name, "pod-a", wait=10)

        sign_in(browser, page_url(cluster, leader), admin_token)
        lock_row = row(browser, "locks", lock_name)
        assert lock_row["holder"] == f"payments-worker-a (session {holder.id})"
        assert lock_row["token"] == str(held.token)
        assert lock_row["waiters"] == [
            f"payments-worker-b (session {second.id})",
            f"payments-worker-c (session {third.id})",
        ], "the waiters, first in line first"

        semaphore_row = row(browser, "semaphores", semaphore_name)
        assert semaphore_row["held"] == "2 of 2"
        assert "full" in semaphore_row["held_class"].split()
        assert semaphore_row["waiters"] == [f"payments-worker-c (session {third.id})"]

        election_row = row(browser, "elections", election_name)
        assert election_row["leader"] == f"payments-worker-a (session {holder.id})"
        assert election_row["value"] == "pod-a"
        assert election_row["token"] == str(leadership.token)

        watched = row(browser, "watched", "test:cron/*", key="watch")
        grants, last_grant = watched["cells"][1:]
        assert int(grants) >= 1 and last_grant.endswith(" ago"), "the election's grant counts under cron/*"

        assert sorted(int(node) for node in row_keys(browser, "members", "node")) == sorted(cluster.nodes)
        assert "leader" in row(browser, "members", str(leader), key="node")["cells"][0]
        screenshot = Path(cluster.root) / "status-page.png"
        assert browser.save_screenshot(str(screenshot)), "the screenshot could not be saved"
        if os.environ.get("LEASEHOLD_SCREENSHOT"):
            shutil.copyfile(screenshot, os.environ["LEASEHOLD_SCREENSHOT"])

        # The release reaches the open page by itself: the same document, redrawn.
        browser.execute_script("window.leaseholdTestMarker = 'not reloaded'")
        held.release()
        waiting_b.join(timeout=30)
        assert "b" in granted, "B was not granted the lock after A released it"

        holder_b = f"payments-worker-b (session {second.id})"
        lock_row = row(browser, "locks", lock_name, lambda shown: shown["holder"] == holder_b, "B holding the lock")
        assert lock_row["token"] == str(granted["b"].token)
        assert granted["b"].token > held.token
        assert lock_row["waiters"] == [f"payments-worker-c (session {third.id})"]
        assert browser.execute_script("return window.leaseholdTestMarker") == "not reloaded"

        # The search box filters every table: by client name, sessions show only C's.
        browser.find_element(By.ID, "search").send_keys("payments-worker-c")

        WebDriverWait(browser, PAGE_WAIT_S).until(
            lambda _: row_keys(browser, "sessions", "session") == [str(third.id)],
            "the search to leave only C's session",
        )
        assert row_keys(browser, "locks", "name") == [], "no lock name matches"
        assert browser.find_element(By.ID, "sessions-count").text.startswith("(1 of ")

        granted["b"].release()
        waiting_c.join(timeout=30)
        for permit in permits:
            permit.release()
        leadership.resign()
        granted["c"].release()


def test_a_followers_page_shows_the_replicated_state_and_the_leaders_progress(
    cluster: LocalCluster, browser: WebDriver
) -> None:
    leader = cluster.wait_for_agreed_leader()
    follower = next(node_id for node_id in cluster.nodes if node_id != leader)
    name = "page/on-a-follower"
    with cluster.client(client_name="follower-page-check") as client, client.session(ttl=30) as session:
        with session.lock(name, wait=10) as guard:
            cluster.wait_applied(follower, cluster.status(leader).commit_index)
            sign_in(browser, page_url(cluster, follower), cluster.admin_token_file.read_text().splitlines()[0].strip())
            found = row(browser, "locks", name)
            assert found["token"] == str(guard.token)
            summary = browser.find_element(By.ID, "node-summary").text
            assert f"node {follower} · follower" in summary and f"leader: node {leader}" in summary
            note = browser.find_element(By.ID, "members-note").text
            assert f"as the leader (node {leader}) reports them" in note, note
            # The leader's replication progress, asked for over the peer port.
            for node_id in cluster.nodes:
                matched = row(browser, "members", str(node_id), key="node")["cells"][3]
                assert matched.isdigit(), f"node {node_id}'s matched index: {matched!r}"


def test_the_page_refuses_a_wrong_token_and_its_data_needs_the_admin_credential(
    cluster: LocalCluster, browser: WebDriver
) -> None:
    leader = cluster.wait_for_leader()
    url = page_url(cluster, leader)
    sign_in(browser, url, "not-the-admin-token")
    error = browser.find_element(By.ID, "login-error")
    WebDriverWait(browser, PAGE_WAIT_S).until(lambda _: error.text, "the page to say the token was refused")
    assert "refused" in error.text
    assert not browser.find_element(By.ID, "status").is_displayed()

    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    tenant_token = cluster.token_file.read_text().splitlines()[0].strip()
    for headers in ({}, {"Authorization": f"Bearer {tenant_token}"}):
        request = urllib.request.Request(f"{url}api/status", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=10)
        assert refused.value.code == 401, "a tenant's token or none must not read the whole cluster"

    admin_token = cluster.admin_token_file.read_text().splitlines()[0].strip()
    request = urllib.request.Request(f"{url}api/status?q=zz", headers={"Authorization": f"Bearer {admin_token}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        report = json.load(answer)
    assert report["node"]["id"] == leader and report["node"]["state"] == "leader"
    text = json.dumps(report)
    assert admin_token not in text and tenant_token not in text, "the page's data must carry no credential"

    with pytest.raises(urllib.error.HTTPError) as bad:
        request = urllib.request.Request(f"{url}api/status?lock=1", headers={"Authorization": f"Bearer {admin_token}"})
        urllib.request.urlopen(request, context=context, timeout=10)
    assert bad.value.code == 400 and "unknown parameter" in bad.value.read().decode()


#: Connections a slow reader opens from one address, each asking for page.js again
#: and again without reading an answer: as many as the page served at once before
#: each address had a share.
SLOW_READERS = 64
#: What one address may hold on the status port (`STATUS_LIMITS.sources`).
STATUS_CONNECTIONS_PER_SOURCE = 16


def test_connections_that_never_read_keep_no_one_else_from_the_page(cluster: LocalCluster) -> None:
    """64 connections from 127.0.0.2 that ask for page.js again and again and never
    read: the node keeps at most its per-address share of them, and a browser from
    127.0.0.1 still gets the page within a second."""
    leader = cluster.wait_for_leader()
    host, port = cluster.nodes[leader].status_addr.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    request = f"GET /page.js HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() * 400
    stalled: List[socket.socket] = []
    handshaken = 0
    try:
        for _ in range(SLOW_READERS):
            raw = socket.create_connection((host, int(port)), timeout=2, source_address=("127.0.0.2", 0))
            stalled.append(raw)
            try:
                connection = context.wrap_socket(raw, server_hostname=host)
            except (OSError, ssl.SSLError):
                continue  # closed by the node at once: the address holds its share
            stalled.append(connection)
            handshaken += 1
            connection.settimeout(0.5)
            try:
                # Written until the node stops taking requests because nobody reads.
                connection.sendall(request)
            except OSError:
                pass
        assert 0 < handshaken <= STATUS_CONNECTIONS_PER_SOURCE, f"{handshaken} of {SLOW_READERS} served"
        started = time.monotonic()
        with urllib.request.urlopen(page_url(cluster, leader), context=context, timeout=10) as answer:
            assert answer.status == 200 and b"<html" in answer.read().lower()
        took = time.monotonic() - started
        assert took < 1.0, f"the page took {took:.2f} s beside {SLOW_READERS} connections that never read"
    finally:
        for connection in stalled:
            connection.close()
