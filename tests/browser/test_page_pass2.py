"""The page, second pass (issue 36), each item checked in Chromium on a tab of the real page:
a setting the run refuses is refused at its field before Start and never leaves the page
stuck (item 2); the task's defaults come from the one table every command reads (item 3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import run_selftest
from test_page_try import _draw_one

pytestmark = pytest.mark.browser

CLI = Path(sys.executable).with_name("daisychain")
READY = "window.__daisy && window.__daisy.ready && window.__daisy.id && window.__daisy.datasetsLoaded"


def _host(page, base: str, name: str = "host") -> None:
    page.goto(f"{base}/?name={name}&path=cpu")
    page.wait_for_function(READY, timeout=120_000)
    page.click("#create-room")
    page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)


def _editable(page) -> bool:
    return page.evaluate("""() => [...document.querySelector('#settings').elements].every((e) => !e.disabled)
      && !document.querySelector('#start').disabled""")


def test_a_model_the_data_cannot_hold_is_refused_at_its_field_and_start_stays_usable(cpu_page, server_url):
    """Issue 36 item 2: digits with layers conv8 (and image with seven halvings of 28 px)
    showed no error at the field; Start left the page on "Preparing the run: model (1 of 4)"
    with every field disabled and Stop doing nothing."""
    _host(cpu_page, server_url)
    cpu_page.fill("#f-layers", "conv8")
    # at the field, before Start
    cpu_page.wait_for_function("document.querySelector('#err-layers').textContent.includes('image input')", timeout=30_000)
    cpu_page.click("#start")
    cpu_page.wait_for_timeout(1500)
    assert cpu_page.evaluate("window.__daisy.run.state") == "idle"
    assert _editable(cpu_page)
    assert "image input" in cpu_page.inner_text("#err-layers")
    # image: a model that pools the 28 px input away, refused at the field once the data is in
    cpu_page.select_option("#f-task", "image")
    cpu_page.fill("#f-layers", "conv8,pool,pool,pool,pool,pool,pool")
    cpu_page.click("#start")
    cpu_page.wait_for_function("document.querySelector('#err-layers').textContent.length > 0", timeout=180_000)
    cpu_page.wait_for_timeout(1000)
    assert cpu_page.evaluate("window.__daisy.run.state") == "idle"
    assert cpu_page.is_hidden("#preparing")
    assert _editable(cpu_page)
    # a right model then starts, and Stop stops it
    cpu_page.select_option("#f-task", "digits")
    cpu_page.fill("#f-layers", "")
    cpu_page.fill("#f-steps", "400")
    cpu_page.wait_for_function("document.querySelector('#err-layers').textContent === ''", timeout=30_000)
    cpu_page.click("#start")
    cpu_page.wait_for_function("window.__daisy.run.state === 'running' && window.__daisy.run.step > 2", timeout=120_000)
    cpu_page.click("#stop")
    cpu_page.wait_for_function("window.__daisy.run.state === 'done'", timeout=60_000)
    assert _editable(cpu_page)


def test_a_refusal_after_start_returns_to_editable_settings_with_the_reason_at_the_field(cpu_page, server_url):
    """Issue 36 item 2: whatever fails after Start (here the run's own model check, reached
    with the page's check before Start skipped) returns the page to editable settings."""
    _host(cpu_page, server_url)
    cpu_page.fill("#f-layers", "conv8")
    cpu_page.evaluate("""() => {
      const s = window.__daisy.mesh;  // the run's own checks only: the settings as Start sends them
      return s.start({ task: 'digits', steps: 5, layers: ['conv8'] }).catch((e) => e.message);
    }""")
    cpu_page.wait_for_function("window.__daisy.mesh.summary && window.__daisy.mesh.summary.state === 'idle'", timeout=30_000)
    assert cpu_page.evaluate("window.__daisy.run.state") == "idle"
    assert _editable(cpu_page)


def test_choosing_the_image_task_fills_its_defaults_from_the_table(cpu_page, server_url):
    """Issue 36 item 3: choosing image kept digits' lr 0.003 and 600 steps; the CLI trains
    0.006 and 3,000 with the image recipe. The page shows what the rate does in the run."""
    _host(cpu_page, server_url)
    cpu_page.select_option("#f-task", "image")
    assert cpu_page.input_value("#f-lr") == "0.006"
    assert cpu_page.input_value("#f-steps") == "3000"
    hint = cpu_page.inner_text("#hint-lr")
    assert "over the first 100 steps" in hint and "to 0 at step 3,000" in hint and "2 px" in hint, hint
    cpu_page.fill("#f-steps", "200")  # a value the host typed stays, and the schedule follows it
    cpu_page.select_option("#f-task", "digits")
    assert cpu_page.input_value("#f-lr") == "0.003" and cpu_page.input_value("#f-steps") == "200"
    assert cpu_page.inner_text("#hint-lr") == "constant through the run"


def test_selftest_of_the_image_task_trains_what_daisychain_train_trains(cpu_page, server_url):
    """Issue 33 item 1: /selftest?task=image ignored the image task's defaults (lr 0.006, the
    shifts, warm-up and decay): its hash was another run's than `daisychain train --task image`."""
    cli = subprocess.run([str(CLI), "train", "--task", "image", "--steps", "3", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    want = json.loads(cli.stdout)["params_sha256"]
    got = run_selftest(cpu_page, f"{server_url}/selftest?task=image&steps=3&path=cpu", 600_000)
    assert got["error"] is None, got["error"]
    assert got["training"]["params_sha256"] == want


def _png(color, size=(40, 30)) -> bytes:
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_an_image_model_can_be_tried_by_drawing_a_gallery_pick_and_a_file(cpu_page, server_url):
    """Issue 36 item 1: Try the model refused every image-task model ("neither images nor
    text"). A drawn stroke, a test image picked in the gallery and an image file are each
    made into the model's 28 x 28 input and answered with every class's probability."""
    _host(cpu_page, server_url)
    cpu_page.select_option("#f-task", "image")
    cpu_page.fill("#f-steps", "4")
    cpu_page.fill("#f-layers", "conv4,pool,16")
    cpu_page.click("#start")
    cpu_page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 4", timeout=300_000)
    sha = cpu_page.evaluate("window.__daisy.run.sha")
    cpu_page.click("#try-it")
    assert cpu_page.is_visible("#try-panel canvas.try-draw") and cpu_page.is_hidden("#try-panel .try-none")
    _draw_one(cpu_page)
    cpu_page.wait_for_function("document.querySelectorAll('#try-panel .try-probs li').length === 10", timeout=60_000)
    seen = cpu_page.evaluate("(() => { const c = document.querySelector('#try-panel canvas.try-input'); return [c.width, c.height]; })()")
    assert seen == [28, 28]
    probs = cpu_page.evaluate("window.__tryPanel.lastProbs")
    assert len(probs) == 10 and abs(sum(probs) - 1) < 1e-9
    assert "It reads" in cpu_page.inner_text("#try-panel .try-answer")
    # a test image picked in the gallery
    cpu_page.click("#gallery figure.g-item >> nth=3")
    cpu_page.wait_for_function("document.querySelector('#try-panel .try-answer').textContent.startsWith('test image')", timeout=60_000)
    # an image file (a light picture: turned over to MNIST's dark background)
    cpu_page.set_input_files("#try-panel .try-file", files=[{"name": "white.png", "mimeType": "image/png", "buffer": _png((255, 255, 255))}])
    cpu_page.wait_for_function("document.querySelector('#try-panel .try-answer').textContent.startsWith('white.png')", timeout=60_000)
    assert "turned over" in cpu_page.inner_text("#try-panel .try-answer")
    cpu_page.set_input_files("#try-panel .try-file", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hi"}])
    cpu_page.wait_for_function("document.querySelector('#try-panel .try-answer').textContent.includes('not an image file')", timeout=30_000)
    sha_now = cpu_page.evaluate("""async () => {
      const { paramsSha256 } = await import('/webui/engine/trainer.js');
      return paramsSha256(window.__daisy.mesh.peer.trainer.theta);
    }""")
    assert sha_now == sha  # trying read the parameters only


def test_an_rgb_picture_and_drawing_become_the_models_colour_input(cpu_page, server_url):
    """Issue 36 item 1, RGB: each channel of a colour picture or a coloured stroke reaches
    its own plane of the [3, h, w] input (channels first, as the data is)."""
    cpu_page.route(f"{server_url}/__blank", lambda route: route.fulfill(body="<!doctype html><title>t</title>",
                                                                         content_type="text/html"))
    cpu_page.goto(f"{server_url}/__blank")
    got = cpu_page.evaluate("""async () => {
      const T = await import('/webui/page/panels/try_image.js');
      const W = 20, H = 10, red = new Uint8ClampedArray(4 * W * H);
      for (let i = 0; i < W * H; i++) { red[4 * i] = 255; red[4 * i + 3] = 255; }
      const pic = T.fromPicture(red, W, H, [3, 4, 6], 255).input;
      const grey = T.fromPicture(red, W, H, [1, 4, 6], 255);
      const ink = new Uint8ClampedArray(4 * 100 * 100);  // black, with a green square drawn
      for (let y = 30; y < 70; y++) for (let x = 40; x < 60; x++) { ink[4 * (y * 100 + x) + 1] = 255; }
      const drawn = T.fromDrawing(ink, 100, 100, [3, 8, 8], 255, true);
      const sum = (a, k, n) => a.slice(k * n, (k + 1) * n).reduce((s, v) => s + v, 0);
      return { pic: [0, 1, 2].map((k) => sum(pic, k, 24)), grey: [grey.input[0], grey.inverted],
               drawn: [0, 1, 2].map((k) => sum(drawn, k, 64)) };
    }""")
    assert got["pic"] == [255 * 24, 0, 0]
    assert got["grey"] == [76, False]  # luminance of red; a dark picture is not turned over
    assert got["drawn"][0] == 0 and got["drawn"][2] == 0 and got["drawn"][1] > 0


def _fail_first(page, pattern: str, times: int) -> list:
    """Abort the first `times` requests matching `pattern` as a dropped network does."""
    seen = []

    def handle(route):
        seen.append(route.request.url)
        if len(seen) <= times:
            route.abort("internetdisconnected")
        else:
            route.continue_()
    page.route(pattern, handle)
    return seen


def test_a_first_load_with_the_network_down_says_so_and_retries(cpu_page, server_url):
    """Issue 36 item 7: ERR_NETWORK_CHANGED during the self-test left the page on
    "Starting…" forever, with no error and no retry."""
    seen = _fail_first(cpu_page, "**/golden/units.json", 2)
    statuses = []
    cpu_page.expose_function("__status", lambda t: statuses.append(t))
    cpu_page.add_init_script("""new MutationObserver(() => window.__status(document.querySelector('#status')?.textContent || ''))
      .observe(document, { subtree: true, childList: true, characterData: true });""")
    cpu_page.goto(f"{server_url}/?name=flaky&path=cpu")
    cpu_page.wait_for_function(READY, timeout=120_000)
    assert len(seen) == 3
    said = [s for s in statuses if "Trying again" in s]
    assert said and "the network may have dropped" in said[0], statuses[-5:]


def test_a_module_the_network_dropped_loads_the_page_again(cpu_page, server_url):
    """Issue 36 item 7: a file of the page's code lost on the way leaves nothing running;
    the page says so and loads itself again."""
    seen = _fail_first(cpu_page, "**/webui/page/panels/events.js", 1)
    cpu_page.goto(f"{server_url}/?name=flaky2&path=cpu")
    cpu_page.wait_for_function("document.querySelector('#status').textContent.includes('did not load')", timeout=30_000)
    cpu_page.wait_for_function(READY, timeout=120_000)
    assert len(seen) >= 2


def test_capacity_is_measured_on_the_runs_own_model(cpu_page, server_url):
    """Issue 36 item 5: the pooled capacity said 1838.5 micro-batches/s (the self-test's
    digits probe) while the image run computed ~20: the split and the time left used the
    probe. Every device now measures the run's model when the run starts, per device."""
    _host(cpu_page, server_url)
    cpu_page.select_option("#f-task", "image")
    cpu_page.fill("#f-steps", "3")
    cpu_page.click("#start")  # the default CNN
    cpu_page.wait_for_function("window.__daisy.end && window.__daisy.end.step === 3", timeout=300_000)
    dev = cpu_page.evaluate("window.__daisy.device")
    assert dev["runCapacity"] > 0 and dev["runCapacity"] < dev["capacity"] / 5, dev
    assert "on the run's model" in cpu_page.inner_text("#device-capacity")
    assert "on the run's model" in cpu_page.inner_text("#pooled")
    row = cpu_page.inner_text("#peers tr")
    assert "on the run's model" in row, row
    pooled = float(cpu_page.inner_text("#pooled").split()[0])
    assert pooled < dev["capacity"] / 5, (pooled, dev)


def test_the_confusion_matrix_fits_a_phone(browser_nogpu, server_url):
    """Issue 36 item 6: at 390 px the matrix's three-digit cells wrapped and the table was cut
    after column 5."""
    ctx = browser_nogpu.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    try:
        page = ctx.new_page()
        _host(page, server_url, "phone")
        page.select_option("#f-task", "image")
        page.fill("#f-steps", "3")
        page.fill("#f-layers", "conv4,pool,16")
        page.click("#start")
        page.wait_for_selector("#end-confusion:not([hidden])", timeout=300_000)
        fit = page.evaluate("""() => {
          const box = document.querySelector('#end-confusion .table-box');
          const t = document.querySelector('#confusion');
          const cells = [...t.querySelectorAll('td, th')];
          const h = t.querySelector('td').getBoundingClientRect().height;
          return { box: [box.scrollWidth, box.clientWidth], right: t.getBoundingClientRect().right,
                   width: document.documentElement.clientWidth,
                   cut: cells.filter((c) => c.scrollWidth > c.clientWidth + 1).map((c) => c.textContent),
                   tall: [...t.querySelectorAll('td')].filter((c) => c.getBoundingClientRect().height > h * 1.5).length,
                   big: Math.max(...[...t.querySelectorAll('td')].map((c) => c.textContent.length)),
                   cols: t.rows[0].cells.length };
        }""")
        assert fit["cols"] == 11
        assert fit["big"] >= 3, fit  # three-digit counts are there to fit
        assert fit["box"][0] <= fit["box"][1] and fit["right"] <= fit["width"], fit
        assert fit["cut"] == [] and fit["tall"] == 0, fit
    finally:
        ctx.close()


def _boxes(page, ids):
    return page.evaluate("""(ids) => Object.fromEntries(ids.map((id) => {
      const r = document.getElementById(id).getBoundingClientRect();
      return [id, { top: r.top + scrollY, left: r.left, right: r.right, bottom: r.bottom + scrollY }];
    }))""", ids)


def test_the_page_is_laid_out_by_the_runs_phase(browser_nogpu, server_url):
    """Issue 36 item 9: at 1280 px the room and device cards left tall empty columns next
    to the long settings form. Before a run the form comes first with the room and the
    device beside it; during the run the progress comes first; at the end the results."""
    ctx = browser_nogpu.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = ctx.new_page()
        _host(page, server_url, "wide")
        ids = ["checklist-panel", "settings-panel", "room-panel", "device-panel", "train-panel", "end-card"]
        b = _boxes(page, ids[:5])
        s = b["settings-panel"]
        for card in ("room-panel", "device-panel"):  # beside the form, inside its height
            assert b[card]["left"] >= s["right"] and b[card]["top"] < s["bottom"], (card, b)
        empty = max(0, (b["device-panel"]["bottom"] - b["room-panel"]["top"]) - (s["bottom"] - s["top"]))
        tall = max(0, (s["bottom"] - s["top"]) - (b["device-panel"]["bottom"] - b["room-panel"]["top"]))
        assert min(empty, tall) == 0 and max(empty, tall) < 0.5 * (s["bottom"] - s["top"]), b
        page.fill("#f-steps", "400")
        page.click("#start")
        page.wait_for_function("window.__daisy.run.state === 'running' && window.__daisy.run.step > 1", timeout=120_000)
        b = _boxes(page, ids[:5])
        assert b["train-panel"]["top"] < b["settings-panel"]["top"] and b["train-panel"]["top"] < b["room-panel"]["top"], b
        page.click("#stop")
        page.wait_for_selector("#end-card:not([hidden])", timeout=60_000)
        b = _boxes(page, ids)
        assert b["end-card"]["top"] < b["train-panel"]["top"] < b["settings-panel"]["top"], b
        page.click("#back-to-settings")  # the next run's settings come first again
        b = _boxes(page, ids[:5])
        assert b["settings-panel"]["top"] < b["train-panel"]["top"], b
    finally:
        ctx.close()


def test_an_rgb_image_model_is_tried_with_a_colour_pen(browser_nogpu):
    """Issue 36 item 1, RGB: a model of colour images (3 x 8 x 8, served as a data set of its
    own) is tried by a stroke of the colour picked; the model sees its colour."""
    from conv_server import serving
    from test_conv_selftest import image_set

    with serving({"imagergb": image_set("imagergb", 3, 8, 8)}) as url:
        page = browser_nogpu.new_page()
        try:
            _host(page, url, "rgb")
            page.evaluate("""() => window.__daisy.mesh.start({ task: 'imagergb', steps: 3, batch: 32, micro_batch: 8,
              layers: ['conv4', 'pool', 8] })""")
            page.wait_for_function("window.__daisy.run.state === 'done'", timeout=120_000)
            page.click("#try-it")
            assert page.is_visible("#try-panel .try-colour")
            page.fill("#try-panel .try-colour", "#ff0000")
            _draw_one(page)
            page.wait_for_function("document.querySelectorAll('#try-panel .try-probs li').length === 4", timeout=60_000)
            seen = page.evaluate("""() => {
              const c = document.querySelector('#try-panel canvas.try-input');
              const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
              let red = 0, other = 0;
              for (let i = 0; i < d.length; i += 4) { red += d[i]; other += d[i + 1] + d[i + 2]; }
              return { w: c.width, h: c.height, red, other };
            }""")
            assert (seen["w"], seen["h"]) == (8, 8) and seen["red"] > 0 and seen["other"] == 0, seen
            assert "8 × 8, colour" in page.inner_text("#try-panel .try-input-label")
        finally:
            page.close()
