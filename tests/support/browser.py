"""A real headless Chromium for the dashboard's tests (Debian's `chromium`
and `chromium-driver`, driven by selenium), and the two ways they read a
page that refreshes itself."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_SECONDS = 30


def require_chromium() -> None:
    """Skip the calling module where Chromium is missing; under CI, fail."""
    if os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK):
        return
    if os.environ.get("CI"):
        raise RuntimeError("chromium and chromium-driver are missing: scripts/test installs them")
    pytest.skip("chromium and chromium-driver are not installed", allow_module_level=True)


def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium, quit afterwards (a fixture's body)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # Chromium refuses to run as root without it
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait(browser: Any, condition: Callable[[], Any], message: str) -> Any:
    # A page that refreshes itself may replace an element between finding it
    # and reading it, and a click only starts the navigation it causes: the
    # condition finds the element again at the next poll (WebDriverWait also
    # ignores NoSuchElementException).
    return WebDriverWait(
        browser, WAIT_SECONDS, ignored_exceptions=(StaleElementReferenceException,)
    ).until(lambda _: condition(), message)


def text_of(browser: Any, element_id: str) -> str:
    """The element's text, found again if a refresh replaced it meanwhile."""
    for _ in range(10):
        try:
            return browser.find_element(By.ID, element_id).text
        except StaleElementReferenceException:
            continue
    return browser.find_element(By.ID, element_id).text
