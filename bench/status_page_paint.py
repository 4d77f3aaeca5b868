"""How fast the status page draws a big cluster, in Debian's headless Chromium: for
each of --loads page loads (the admin token already in the tab), the time from the
navigation's start to the page's first drawn answer (the `leasehold-first-draw`
mark that page.js sets), and the first contentful paint; then the /api/status
answer's own time over --requests requests, without a search and with one that
matches nothing (which walks every table). Prints a table and a JSON line.

    python bench/status_page_paint.py --url https://127.0.0.1:7401/ \\
        --token-file .cluster/admin.token --ca-file .cluster/certs/ca.pem

Needs selenium (scripts/test.sh installs it into $CARGO_TARGET_DIR/python-venv)."""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

#: When the performance entry named by the script's argument started (ms after the
#: navigation began), or null before it exists.
START_OF = "const found = performance.getEntriesByName(arguments[0]); return found.length ? found[0].startTime : null"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--ca-file", required=True)
    parser.add_argument("--loads", type=int, default=10)
    parser.add_argument("--requests", type=int, default=20)
    arguments = parser.parse_args()
    token = open(arguments.token_file).read().splitlines()[0].strip()

    context = ssl.create_default_context(cafile=arguments.ca_file)

    def answers(query: str) -> tuple:
        times_ms, body = [], b""
        for _ in range(arguments.requests):
            request = urllib.request.Request(
                f"{arguments.url}api/status{query}", headers={"Authorization": f"Bearer {token}"}
            )
            started = time.monotonic()
            with urllib.request.urlopen(request, context=context, timeout=30) as answer:
                body = answer.read()
            times_ms.append((time.monotonic() - started) * 1000)
        return times_ms, body

    answer_ms, body = answers("")
    answer_bytes = len(body)
    report = json.loads(body)
    searched_ms, _ = answers("?q=no-such-name-anywhere")

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1300"):
        options.add_argument(argument)
    options.accept_insecure_certs = True
    browser = webdriver.Chrome(options=options, service=Service(executable_path="/usr/bin/chromedriver"))
    drawn_ms, contentful_ms = [], []
    try:
        browser.get(arguments.url)
        browser.execute_script("sessionStorage.setItem('leasehold-admin-token', arguments[0])", token)
        for _ in range(arguments.loads):
            browser.get(arguments.url)
            mark = WebDriverWait(browser, 30).until(
                lambda _: browser.execute_script(START_OF, "leasehold-first-draw"), "the page's first drawn answer"
            )
            drawn_ms.append(mark)
            paint = browser.execute_script(START_OF, "first-contentful-paint")
            if paint is not None:
                contentful_ms.append(paint)
    finally:
        browser.quit()

    figures = {
        "sessions": report["sessions"]["total"],
        "locks": report["locks"]["total"],
        "answer_bytes": answer_bytes,
        "answer_ms_median": statistics.median(answer_ms),
        "answer_ms_max": max(answer_ms),
        "searched_answer_ms_median": statistics.median(searched_ms),
        "searched_answer_ms_max": max(searched_ms),
        "first_draw_ms_median": statistics.median(drawn_ms),
        "first_draw_ms_max": max(drawn_ms),
        "first_contentful_paint_ms_median": statistics.median(contentful_ms) if contentful_ms else None,
    }
    print(f"cluster: {figures['sessions']} sessions, {figures['locks']} locks; one answer is {answer_bytes} bytes")
    print(f"/api/status answer: median {figures['answer_ms_median']:.1f} ms, max {figures['answer_ms_max']:.1f} ms "
          f"over {arguments.requests} requests")
    print(f"/api/status answer to a search that matches nothing: median {figures['searched_answer_ms_median']:.1f} ms, "
          f"max {figures['searched_answer_ms_max']:.1f} ms")
    print(f"page load to first drawn answer: median {figures['first_draw_ms_median']:.0f} ms, "
          f"max {figures['first_draw_ms_max']:.0f} ms over {arguments.loads} loads")
    if contentful_ms:
        print(f"first contentful paint: median {figures['first_contentful_paint_ms_median']:.0f} ms")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
