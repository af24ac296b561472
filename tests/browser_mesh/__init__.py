"""Mesh tier with real Chromium tabs of the page."""
