"""Debian's Chromium as every browser test, bench and script here launches it: one path, one
list of flags, and the ``--disable-features`` merge.

Playwright passes one ``--disable-features=...`` list of its own and Chromium keeps only the
last such flag, so ours (``WebRtcHideLocalIpsWithMdns``: host candidates as plain addresses,
not ``.local`` names that nothing here resolves) is merged with Playwright's list, read once
from ``chrome://version``, and passed last."""

from __future__ import annotations

import re

CHROMIUM = "/usr/bin/chromium"
BASE_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run"]
WEBGPU_ARGS = ["--enable-unsafe-webgpu"]
OUR_DISABLED = ["WebRtcHideLocalIpsWithMdns"]


def disable_features(playwright, args: list[str] = BASE_ARGS) -> str:
    """Playwright's own ``--disable-features`` list merged with ours, as one flag to pass last
    (``playwright``: a started sync_playwright; ``args``: the flags the probe launches with)."""
    probe = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
    try:
        page = probe.new_page()
        page.goto("chrome://version")
        found = re.findall(r"--disable-features=(\S+)", page.inner_text("#command_line"))
    finally:
        probe.close()
    theirs = found[-1].split(",") if found else []
    return "--disable-features=" + ",".join(dict.fromkeys(theirs + OUR_DISABLED))
