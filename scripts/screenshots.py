"""Screenshots of the page for README.md: the room mid-run and the end card, at 1280 px (the
host, a laptop) and 390 px (a phone that joined by the room's link); the phone mid-run
scrolled to the chart with the status bar pinned at the top; the "try the model" panel on
the text model (a sampled continuation) and on a digits model (a drawn digit); the gallery
and the confusion matrix of a small CNN on the embedded MNIST, and that image model tried
(a drawn digit at its 28 x 28 input) at 1280 and 390 px; the settings of a new run before it
starts; into docs/screenshots/.

WebRTC needs the private network namespace (as the browser_mesh tests):

    ./scripts/in-netns.sh .venv/bin/python scripts/screenshots.py [--out docs/screenshots]

It starts the real server on 127.0.0.1, two headless Chromium pages of the real page, a run
of a 2-hidden-layer model on a small text file the host sends from disk, and waits on the
page's own state (window.__daisy), as the tests do.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from aiohttp import web
from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._chromium import BASE_ARGS, CHROMIUM, disable_features  # noqa: E402
from daisychain.server.app import create_app  # noqa: E402
from daisychain.server.config import ServerConfig  # noqa: E402

ARGS = BASE_ARGS
TEXT = "\n".join(["the daisy opens at dawn and closes at dusk",
                  "every petal counts the steps we take together",
                  "small models learn from what the room can give",
                  "a chain of flowers, a chain of devices, one sum"] * 12) + "\n"


def serve() -> str:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start() -> int:
        runner = web.AppRunner(create_app(ServerConfig(port=0, grace_s=2.0, tick_s=0.2)))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    return f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(start(), loop).result(30)}"


def draw_two(page) -> None:
    """A "2" drawn with the mouse in the try panel's box."""
    page.locator("#try-panel canvas.try-draw").scroll_into_view_if_needed()
    box = page.locator("#try-panel canvas.try-draw").bounding_box()
    pts = [(0.3, 0.25), (0.5, 0.15), (0.7, 0.25), (0.65, 0.45), (0.3, 0.85), (0.75, 0.85)]
    page.mouse.move(box["x"] + pts[0][0] * box["width"], box["y"] + pts[0][1] * box["height"])
    page.mouse.down()
    for fx, fy in pts[1:]:
        page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"], steps=8)
    page.mouse.up()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/screenshots")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--image-steps", type=int, default=150)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if "default" not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout:
        subprocess.run(["ip", "route", "add", "default", "dev", "dc0"], check=True)  # as conftest
    base = serve()
    with sync_playwright() as p, tempfile.TemporaryDirectory() as tmp:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS + [disable_features(p)])
        host = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2).new_page()
        wait = lambda page, js, t=180_000: page.wait_for_function(js, timeout=t)  # noqa: E731
        host.goto(f"{base}/?name=Laptop&create=1")
        wait(host, "window.__daisy && window.__daisy.room && window.__daisy.room.isHost && window.__daisy.datasetsLoaded")
        wait(host, "(() => { const i = document.getElementById('room-qr'); return i.complete && i.naturalWidth > 0; })()")
        link = host.get_attribute("#room-link", "href")
        phone.goto(f"{link}&name=Phone")
        wait(host, "document.querySelectorAll('#approvals li[data-peer]').length === 1")
        host.click("#approvals li[data-peer] button.approve")
        wait(phone, "window.__daisy.room && window.__daisy.room.members.length === 2")
        wait(host, "Object.values(window.__daisy.links).includes('open')", 60_000)
        data = Path(tmp) / "poem.txt"
        data.write_text(TEXT)
        host.set_input_files("#data-file", str(data))
        wait(host, "window.__daisy.upload !== null")
        for k, v in dict(steps=a.steps, batch=32, micro_batch=8, layers="32,32", seed=1).items():
            host.fill(f"#settings [name={k}]", str(v))
        host.click("#start")
        wait(host, f"window.__daisy.run.step >= {a.steps // 2}")
        host.screenshot(path=str(out / "room-1280.png"), full_page=True)
        phone.screenshot(path=str(out / "room-390.png"), full_page=False)
        phone.locator("#train-panel").scroll_into_view_if_needed()
        phone.evaluate("window.scrollBy(0, -60)")  # the chart under the pinned status bar
        phone.screenshot(path=str(out / "run-390.png"), full_page=False)
        for page in (host, phone):
            wait(page, "window.__daisy.run.state === 'done' && !document.getElementById('end-card').hidden")
        wait(phone, "document.getElementById('end-command').textContent.includes('daisychain train')")
        host.locator("#end-card").scroll_into_view_if_needed()
        host.screenshot(path=str(out / "end-1280.png"), full_page=False)
        phone.locator("#end-card").scroll_into_view_if_needed()
        phone.screenshot(path=str(out / "end-390.png"), full_page=False)
        # try the model: the text model continues a prompt ...
        host.click("#try-it")
        host.fill("#try-panel .try-prompt", "the daisy ")
        host.click("#try-panel .try-sample")
        wait(host, "document.querySelector('#try-panel .try-continuation').textContent.length === 80")
        host.locator("#try-panel").screenshot(path=str(out / "try-text-1280.png"))
        # ... and a digits run reads a drawn digit
        host.click("#back-to-settings")
        digits = host.evaluate("window.__daisy.datasets.find((d) => d.task === 'digits').fingerprint")
        host.select_option("#f-dataset", digits)
        for k, v in dict(steps=200, batch=64, micro_batch=16, layers="", seed=0).items():
            host.fill(f"#settings [name={k}]", str(v))
        host.click("#start")
        wait(host, "window.__daisy.end && window.__daisy.end.step === 200")
        host.click("#try-it")
        draw_two(host)
        wait(host, "document.querySelectorAll('#try-panel .try-probs li').length === 10")
        host.locator("#try-panel").screenshot(path=str(out / "try-digit-1280.png"))
        # ... and an image run shows its gallery and, at the end, the confusion matrix
        host.click("#back-to-settings")
        host.select_option("#f-task", "image")
        mnist = host.evaluate("window.__daisy.datasets.find((d) => d.task === 'image' && d.origin === 'embedded').fingerprint")
        host.select_option("#f-dataset", mnist)
        for k, v in dict(steps=a.image_steps, batch=64, micro_batch=16, layers="conv8,pool,conv16,pool", seed=0).items():
            host.fill(f"#settings [name={k}]", str(v))
        host.click("#start")
        wait(host, "window.__daisy.end && !document.getElementById('end-confusion').hidden", 600_000)
        wait(host, f"(window.__daisy.galleryShown || []).includes({a.image_steps})")
        host.locator("#gallery-panel").screenshot(path=str(out / "gallery-1280.png"))
        host.locator("#end-confusion").screenshot(path=str(out / "confusion-1280.png"))
        # ... and the image model is tried: a drawn digit made into its 28 x 28 input
        host.click("#try-it")
        draw_two(host)
        wait(host, "document.querySelectorAll('#try-panel .try-probs li').length === 10")
        host.locator("#try-panel").screenshot(path=str(out / "try-image-1280.png"))
        wait(phone, "window.__daisy.run.state === 'done' && !document.getElementById('end-confusion').hidden", 600_000)
        phone.locator("#end-confusion").scroll_into_view_if_needed()
        phone.screenshot(path=str(out / "confusion-390.png"), full_page=False)
        phone.click("#try-it")
        draw_two(phone)
        wait(phone, "document.querySelectorAll('#try-panel .try-probs li').length === 10")
        phone.locator("#try-panel").scroll_into_view_if_needed()
        phone.evaluate("window.scrollBy(0, -60)")  # under the pinned status bar
        phone.screenshot(path=str(out / "try-image-390.png"), full_page=False)
        # the settings of a new run, before it starts (the form with the room and device beside it)
        host.click("#back-to-settings")
        host.evaluate("window.scrollTo(0, 0)")
        host.screenshot(path=str(out / "settings-1280.png"), full_page=False)
        browser.close()
    for f in sorted(out.glob("*.png")):
        print(f, f.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
