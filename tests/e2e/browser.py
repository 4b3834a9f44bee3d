"""Debian's chromium driven by Python Playwright (never a downloaded browser),
with a screenshot and the page's HTML kept when a step fails."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct horse battery"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def chromium_missing() -> str | None:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        return f"{CHROMIUM} is not installed (apt-get install -y --no-install-recommends chromium)"
    return None


@contextlib.contextmanager
def browser_page(base_url: str):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(base_url=base_url, viewport={"width": 1366, "height": 900})
            # Nothing beyond the control plane: a request elsewhere (a CDN) fails the test.
            outside = []
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base_url)
                          else (outside.append(route.request.url), route.abort()))
            page = context.new_page()
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page, errors, outside
        finally:
            browser.close()


@contextlib.contextmanager
def evidence_on_failure(page, directory: Path):
    """Keep a screenshot and the HTML under the test's tmp dir when the block fails."""
    try:
        yield
    except BaseException:
        directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            page.screenshot(path=str(directory / "failure.png"), full_page=True)
            (directory / "failure.html").write_text(page.content())
        raise


def with_password(user) -> None:
    """Give `user` PASSWORD, hashed with one of the server's own hashers: the test process
    hashes with MD5 for speed, which the server does not know."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    user.password = PBKDF2PasswordHasher().encode(PASSWORD, PBKDF2PasswordHasher().salt(), iterations=1000)
    user.save(update_fields=["password"])


def log_in(page, user) -> None:
    """Log `user` (given PASSWORD by with_password) in through the login form."""
    page.goto("/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
