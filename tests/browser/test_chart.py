"""chart.js, the page's canvas chart, in headless Chromium: points change pixels, the axes
carry numbered ticks (a loss axis far from 0 does not start at 0; the log scale ticks at
decades and maps them evenly), hover finds the nearest point, the accuracy axis appears with
accuracy points, devicePixelRatio sizes the bitmap, and the colours come from CSS variables."""

from __future__ import annotations

import math

import pytest
from browser_helpers import open_page

pytestmark = pytest.mark.browser

SETUP = """async ({ w, h, css }) => {
  document.body.innerHTML = `<style>${css}</style><canvas id="c" style="width:${w}px;height:${h}px"></canvas>`;
  const { Chart } = await import('/webui/page/chart.js');
  const c = document.getElementById('c');
  window.__hovered = [];
  window.chart = new Chart(c, { series: [{ key: 'loss', label: 'loss', axis: 'left' },
    { key: 'acc', label: 'accuracy', axis: 'right', format: 'percent' }],
    onHover: (p) => window.__hovered.push(p) });
  window.ink = () => {  // how many pixels are not transparent
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;
  };
  window.colourCount = (rgb) => {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] === rgb[0] && d[i+1] === rgb[1] && d[i+2] === rgb[2] && d[i+3] === 255) n++;
    return n;
  };
}"""


@pytest.fixture
def page(browser_nogpu, server_url):
    p = open_page(browser_nogpu, "chart")
    p.goto(f"{server_url}/webui/shell/bus.js")
    yield p
    p.close()


def _setup(page, w=480, h=240, css=""):
    page.evaluate(SETUP, {"w": w, "h": h, "css": css})


def test_points_draw_and_axes_are_labelled(page):
    _setup(page)
    before = page.evaluate("ink()")
    page.evaluate("() => { for (let s = 1; s <= 100; s++) chart.add('loss', s, 2.2 - s / 200); chart.draw(); }")
    after = page.evaluate("ink()")
    assert after > before + 200
    t = page.evaluate("chart.ticks()")
    left = [x["value"] for x in t["left"]]
    # loss 1.7..2.195 is far from 0: the axis does not start at 0, and covers the data
    assert left[0] > 1.0 and left[0] <= 1.7 and left[-1] >= 2.195
    assert all(b > a for a, b in zip(left, left[1:])) and len(left) >= 3
    assert all(x["label"] and float(x["label"]) == pytest.approx(x["value"]) for x in t["left"])
    # higher values are drawn higher (smaller y)
    assert all(b["px"] < a["px"] for a, b in zip(t["left"], t["left"][1:]))
    xs = [x["value"] for x in t["x"]]
    assert xs[0] <= 1 and xs[-1] >= 100 and all(x["label"] == str(int(x["value"])) for x in t["x"])
    assert t["right"] == []  # no accuracy yet: no second axis


def test_log_scale_maps_decades_evenly(page):
    _setup(page)
    page.evaluate("() => { for (let s = 1; s <= 200; s++) chart.add('loss', s, 3 * Math.pow(0.97, s)); }")
    page.evaluate("chart.setLog(true)")
    t = page.evaluate("chart.ticks()")["left"]
    decades = [x for x in t if math.log10(x["value"]).is_integer()]
    # the data runs 0.0068..2.91: the decades around it, evenly spaced, labelled
    assert [d["value"] for d in decades] == [0.001, 0.01, 0.1, 1, 10]
    gaps = [a["px"] - b["px"] for a, b in zip(decades, decades[1:])]
    assert gaps[0] > 0 and all(g == pytest.approx(gaps[0], abs=0.01) for g in gaps)
    assert [x["label"] for x in decades] == ["0.001", "0.01", "0.1", "1", "10"]
    page.evaluate("chart.setLog(false)")
    lin = page.evaluate("chart.ticks()")["left"]
    assert lin[0]["value"] == 0  # the data (0.007..2.9) comes near 0 on a linear scale


def test_hover_returns_the_nearest_point_and_draws_a_tooltip(page):
    _setup(page)
    page.evaluate("() => { for (let s = 0; s <= 50; s++) chart.add('loss', s, 1 + (s % 5)); chart.draw(); }")
    t = page.evaluate("chart.ticks()")
    x20 = next(x["px"] for x in t["x"] if x["value"] == 20)
    at = page.evaluate("chart.pixelOf('loss', 20, 1)")
    assert at["px"] == pytest.approx(x20)
    y1 = at["py"]
    before = page.evaluate("ink()")
    p = page.evaluate(f"chart.hover({x20 + 2}, {y1 - 3})")
    assert p["key"] == "loss" and p["x"] == 20 and p["y"] == 1
    assert p["text"] == "step 20: loss 1"
    assert page.evaluate("ink()") > before  # the tooltip is drawn
    # the real pointer over the canvas reports the same through onHover
    box = page.locator("#c").bounding_box()
    page.mouse.move(box["x"] + x20 - 2, box["y"] + y1 + 2)
    got = page.evaluate("window.__hovered[window.__hovered.length - 1]")
    assert got["x"] == 20
    assert page.evaluate("chart.hover(null)") is None


def test_accuracy_gets_a_second_axis(page):
    _setup(page)
    page.evaluate("() => { for (let s = 1; s <= 30; s++) chart.add('loss', s, 2 / s); "
                  "chart.add('acc', 10, 0.61); chart.add('acc', 20, 0.83); chart.add('acc', 30, 0.9); chart.draw(); }")
    t = page.evaluate("chart.ticks()")
    right = t["right"]
    assert right and all(0 <= x["value"] <= 1 for x in right)
    assert right[0]["value"] <= 0.61 and right[-1]["value"] >= 0.9
    assert all(x["label"].endswith("%") for x in right)
    p = page.evaluate(f"chart.hover({next(x['px'] for x in t['x'] if x['value'] == 30)}, "
                      f"{next(r['px'] for r in right if r['value'] >= 0.9)})")
    assert p["key"] == "acc" and p["text"] == "step 30: accuracy 90.00%"


def test_device_pixel_ratio_resize_and_css_colours(browser_nogpu, server_url):
    ctx = browser_nogpu.new_context(device_scale_factor=2)
    page = ctx.new_page()
    try:
        page.goto(f"{server_url}/webui/shell/bus.js")
        _setup(page, 300, 150, "canvas { --chart-series-1: rgb(255, 0, 255); }")
        page.evaluate("() => { for (let s = 1; s <= 60; s++) chart.add('loss', s, 1 + Math.sin(s)); chart.draw(); }")
        assert page.evaluate("[document.getElementById('c').width, document.getElementById('c').height]") == [600, 300]
        assert page.evaluate("colourCount([255, 0, 255])") > 100  # the line in the CSS colour
        page.evaluate("document.getElementById('c').style.width = '400px'")
        page.wait_for_function("document.getElementById('c').width === 800")
        assert page.evaluate("chart.ticks().x[chart.ticks().x.length - 1].px") > 300
    finally:
        ctx.close()
