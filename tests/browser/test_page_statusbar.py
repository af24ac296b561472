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
        # one look, in the page, while the run is on: a run of 60 digits steps can end between two
        # round trips of the test (the bar is then gone: it failed so under load)
        seen = page.wait_for_function("""() => {
          const run = window.__daisy.run;
          if (!(run.step >= 2 && run.state === 'running')) return null;
          window.scrollTo(0, document.body.scrollHeight);  // reading the events, far down
          if (!document.querySelector('#rb-step').textContent.includes('/ 60')) return null;
          const r = document.querySelector('#runbar').getBoundingClientRect();
          return r.height ? { y: r.y, height: r.height, title: document.title } : null;
        }""", timeout=120_000).json_value()
        assert 0 <= seen["y"] <= 2 and seen["y"] + seen["height"] < 200, seen
        assert "of 60 steps" in seen["title"], seen
        page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 60", timeout=180_000)
        assert page.title().startswith("Done") and not page.is_visible("#runbar")
    finally:
        ctx.close()
