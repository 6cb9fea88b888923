"""Headless Chromium through Selenium, to drive the dashboard in a real browser (its test, its screenshot).

Debian's `chromium` and `chromium-driver` (scripts/setup.sh installs them when missing); Selenium is pointed at
that chromedriver so that Selenium Manager never tries to download a browser or a driver.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lego.errors import LegoError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver",)


class BrowserUnavailableError(LegoError):
    """No headless Chromium, chromedriver or Selenium here."""


def find_browser() -> tuple[Path, Path] | None:
    """(browser, driver) from LEGO_CHROMIUM / LEGO_CHROMEDRIVER or the PATH; None when either is missing."""
    browser = os.environ.get("LEGO_CHROMIUM") or next((p for name in BROWSERS if (p := shutil.which(name))), None)
    driver = os.environ.get("LEGO_CHROMEDRIVER") or next((p for name in DRIVERS if (p := shutil.which(name))), None)
    if not browser or not driver:
        return None
    return Path(browser), Path(driver)


def headless_chromium(width: int = 1500, height: int = 1000) -> Any:
    """A Selenium WebDriver on headless Chromium; the caller quits it."""
    found = find_browser()
    if found is None:
        raise BrowserUnavailableError(
            "no Chromium and chromedriver on the PATH: run scripts/setup.sh as root, or `apt-get install chromium "
            "chromium-driver` (or set LEGO_CHROMIUM and LEGO_CHROMEDRIVER)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise BrowserUnavailableError("Selenium is not installed: pip install -e '.[test]'") from None
    browser, driver = found
    options = webdriver.ChromeOptions()
    options.binary_location = str(browser)
    # --no-sandbox: Chromium's sandbox needs user namespaces, which containers and root sessions lack.
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--disable-extensions", f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(str(driver)), options=options)


def wait_until(driver: Any, element_id: str, check: Callable[[str], bool], what: str,
               timeout: float = 60.0) -> str:
    """Wait until the element's visible text passes `check`; returns that text. Raises TimeoutException saying
    `what` was awaited and what the element showed instead."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    seen = {"text": ""}

    def passes(current: Any) -> tuple[str] | bool:
        try:
            elements = current.find_elements(By.ID, element_id)
            seen["text"] = elements[0].text if elements else "(no such element)"
        except StaleElementReferenceException:  # re-rendered while read: read it again
            return False
        return (seen["text"],) if elements and check(seen["text"]) else False  # (an empty text passes too)

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(passes)[0]
    except TimeoutException:
        raise TimeoutException(f"#{element_id} did not {what} within {timeout:g}s; it showed: "
                               f"{seen['text'][:2000]!r}") from None


def read_text(driver: Any, element_id: str, timeout: float = 60.0) -> str:
    """The element's visible text, once it exists; read again when the page re-renders it while it is read."""
    return wait_until(driver, element_id, lambda _shown: True, "exist", timeout)


def wait_for_text(driver: Any, element_id: str, text: str, timeout: float = 60.0) -> str:
    """Wait until the element shows `text`; returns the element's text."""
    return wait_until(driver, element_id, lambda shown: text in shown, f"show {text!r}", timeout)


def full_page_screenshot(driver: Any, path: Path, width: int = 1500) -> Path:
    """The whole page (not only the window) as a PNG."""
    height = int(driver.execute_script("return Math.max(document.body.scrollHeight, 800)"))
    driver.set_window_size(width, min(height + 40, 12000))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path


def wait_for_graphs(driver: Any, timeout: float = 60.0) -> int:
    """Wait until every visible Plotly graph has drawn (Dash loads plotly.js after the page); returns how many."""
    from selenium.webdriver.support.ui import WebDriverWait

    script = ("const graphs = [...document.querySelectorAll('.dash-graph')].filter(g => g.offsetParent !== null);"
              "return graphs.every(g => g.querySelector('.main-svg')) ? graphs.length : -1;")

    def drawn(current: Any) -> list[int] | bool:
        count = current.execute_script(script)
        return [count] if count >= 0 else False  # a list: truthy even when there is no graph

    return WebDriverWait(driver, timeout, poll_frequency=0.25).until(drawn)[0]
