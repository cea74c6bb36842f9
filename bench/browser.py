"""Headless Debian chromium through selenium, for the dashboard's browser test and
bench/dashboard_snapshot.py. Flags as this workplace's chromium needs them: no sandbox as
root, and no background networking (its connections would be refused one by one)."""

from __future__ import annotations

import shutil


class BrowserUnavailable(RuntimeError):
    """chromium, chromedriver or selenium is missing, or chromium would not start."""


def headless_chromium(width: int = 1400, height: int = 1500):
    """A selenium Chrome driver on /usr/bin/chromium; the caller quits it."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        raise BrowserUnavailable("chromium / chromedriver not installed (Debian: apt-get "
                                 "install chromium chromium-driver; bin/install-browser)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        raise BrowserUnavailable(f"selenium not installed: {e}") from None
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
              "--no-first-run", "--disable-background-networking", "--disable-sync",
              "--disable-component-update", "--disable-dev-shm-usage",
              f"--window-size={width},{height}"):
        opts.add_argument(a)
    try:
        return webdriver.Chrome(service=Service(driver_path), options=opts)
    except Exception as e:  # WebDriverException and friends: a broken install
        raise BrowserUnavailable(f"chromium could not start: {e}") from None


def enter_api_key(driver, key: str) -> None:
    """Answers the dashboard's API-key form (shown when the server replied 401)."""
    driver.find_element("id", "key").send_keys(key)
    driver.find_element("css selector", "#keyform button").click()
