"""During a run the progress stays in sight, on a phone too: a bar pinned at the top of the
window (step / total, time left, accuracy); the tab's title says the progress and the end
(issue 23, items 5 and 6 of "What to build")."""

from __future__ import annotations

import pytest
from test_page_worker import solo_run

pytestmark = pytest.mark.browser


def test_a_phone_sees_the_progress_at_the_top_during_a_run(browser_nogpu, server_url):
    ctx = browser_nogpu.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2,
                                    is_mobile=True, has_touch=True)
    try:
        page = ctx.new_page()
        solo_run(page, server_url, 60)
        page.wait_for_function("window.__daisy.run.step >= 2 && window.__daisy.run.state === 'running'", timeout=120_000)
        page.evaluate("window.scrollTo(0, document.body.scrollHeight)")  # reading the events, far down
        page.wait_for_function("document.querySelector('#rb-step').textContent.includes('/ 60')", timeout=30_000)
        box = page.locator("#runbar").bounding_box()
        assert box is not None and 0 <= box["y"] <= 2 and box["y"] + box["height"] < 200, box
        assert "of 60 steps" in page.title()
        page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 60", timeout=180_000)
        assert page.title().startswith("Done") and not page.is_visible("#runbar")
    finally:
        ctx.close()
