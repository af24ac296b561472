"""The page as a product, clicked as a new user would: a host on localhost creates a room,
a phone-sized tab opens the link it decodes from the QR code's image (a LAN address: a
plain-http page, so no WebGPU), the host approves, picks a text file from its disk, sets
two hidden layers, and both train; the chart gains points, the end card shows the hash that
`daisychain train` with the exact command it prints makes. A denied tab sees its banner;
at 390 px nothing scrolls sideways.

The server of the QR test listens on 0.0.0.0 inside the private namespace, so /share offers
its LAN addresses (10.77.0.x) as a real one would a phone.
"""

from __future__ import annotations

import asyncio
import io
import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web
from mesh_helpers import IN_NETNS, NETNS_HINT, Tab, needs_netns

from daisychain.server.app import create_app
from daisychain.server.config import ServerConfig

pytestmark = pytest.mark.browser
CLI = Path(sys.executable).with_name("daisychain")
ROOM_OF = "window.__daisy.room"
POEM = "\n".join(["the daisy opens at dawn and closes at dusk",
                  "every petal counts the steps we take together",
                  "small models learn from what the room can give",
                  "a chain of flowers, a chain of devices, one sum"] * 12) + "\n"
# a 2-hidden-layer model on the host's file: small, so that the run takes seconds
RUN = dict(steps=10, seed=3, batch=32, micro_batch=8, lr=0.003, layers="16,16")
NO_SIDE_SCROLL = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"


class LanServer:
    """The app on 0.0.0.0:<random> on its own loop in a thread."""

    def __init__(self):
        self.app = create_app(ServerConfig(host="0.0.0.0", port=0, grace_s=2.0, tick_s=0.2))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> "LanServer":
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> int:
        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "0.0.0.0", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def lan_server():
    if not IN_NETNS:
        pytest.skip(NETNS_HINT)
    srv = LanServer().start()
    yield srv
    srv.stop()


def decode_qr(tab: Tab) -> str:
    """The text of the room card's QR code, read from a screenshot of its image."""
    import zxingcpp
    from PIL import Image

    tab.wait("(() => { const i = document.getElementById('room-qr');"
             " return i && i.complete && i.naturalWidth > 0 && !document.getElementById('share-box').hidden; })()")
    png = tab.page.locator("#room-qr").screenshot()
    found = zxingcpp.read_barcodes(Image.open(io.BytesIO(png)).convert("L"))
    assert len(found) == 1, f"{len(found)} QR codes in the room card's image"
    return found[0].text


def fill_settings(tab: Tab, **s) -> None:
    for key, value in s.items():
        tab.page.fill(f"#settings [name={key}]", str(value))


@needs_netns
def test_phone_scans_the_qr_joins_and_trains_on_the_hosts_file(browser_cpu, lan_server, tmp_path):
    made: list[Tab] = []
    try:
        host = Tab(browser_cpu, f"http://127.0.0.1:{lan_server.port}", "Laptop")
        made.append(host)
        host.context.grant_permissions(["clipboard-read", "clipboard-write"],
                                       origin=f"http://127.0.0.1:{lan_server.port}")
        host.open()
        # the first screen says what to do first
        assert "1 — this device is ready" in host.page.inner_text("#checklist")
        host.wait("document.getElementById('check-ready').classList.contains('done')")
        host.page.click("#create-room")
        host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
        code = host.state(f"{ROOM_OF}.code")
        assert host.page.inner_text("#room-code").replace("\n", "") == code
        assert host.page.locator("#room-code .group").count() == 3  # the code, in groups

        # opened on localhost: the link and the QR code use a LAN address, and say what
        # a plain-http page there gets
        host.wait("window.__daisy.share.links.some((l) => l.lan)")
        link = host.page.get_attribute("#room-link", "href")
        assert link.startswith("http://10.77.0.") and link.endswith(f"/?room={code}"), link
        note = host.page.inner_text("#share-note")
        assert "localhost" in note and "JS units" in note and "secure context" in note, note
        decoded = decode_qr(host)
        assert decoded == link

        host.page.click("#copy-link")
        host.wait("document.getElementById('copy-feedback').textContent === 'Copied'")
        assert host.page.evaluate("navigator.clipboard.readText()") == link
        host.wait("document.getElementById('check-share').classList.contains('done')")

        # the phone: 390 px wide, opens what it read from the QR code
        phone = Tab(browser_cpu, link.split("/?")[0], "Phone")
        made.append(phone)
        phone.page.set_viewport_size({"width": 390, "height": 844})
        phone.page.goto(f"{decoded}&name=Phone")
        phone.wait("window.__daisy && window.__daisy.device !== null", 120_000)
        assert phone.page.evaluate("window.isSecureContext") is False
        reason = phone.page.inner_text("#device-reason")
        assert "WebGPU needs a secure context" in reason and "navigator.gpu is missing" not in reason, reason
        phone.wait("window.__daisy.pending !== null")
        assert phone.page.is_visible("#waiting")
        assert phone.page.evaluate(NO_SIDE_SCROLL)

        host.wait("document.querySelectorAll('#approvals li[data-peer]').length === 1")
        assert "Phone" in host.page.inner_text("#approvals li[data-peer]")
        host.page.click("#approvals li[data-peer] button.approve")
        phone.wait(f"{ROOM_OF} && {ROOM_OF}.members.length === 2")
        pid = phone.id
        host.wait(f"window.__daisy.links['{pid}'] === 'open'", 60_000)

        # the host picks a text file from its disk: the server makes the same DCDS
        poem = tmp_path / "poem.txt"
        poem.write_text(POEM)
        host.wait("window.__daisy.datasetsLoaded", 60_000)
        assert "KiB" in host.page.inner_text("#data-file-hint")  # the size cap is shown
        host.page.set_input_files("#data-file", str(poem))
        host.wait("window.__daisy.upload !== null", 60_000)
        up = host.state("window.__daisy.upload")
        assert up["name"] == "poem.txt" and up["task"] == "text"
        assert host.page.input_value("#settings select[name=dataset]") == up["fingerprint"]
        assert host.page.input_value("#settings select[name=task]") == "text"

        # every setting is checked, the message next to its field
        fill_settings(host, **{**RUN, "batch": 30, "layers": "16,x"})
        host.page.click("#start")
        assert "multiple of the micro-batch" in host.page.inner_text("#err-batch")
        assert "comma-separated hidden widths" in host.page.inner_text("#err-layers")
        assert host.state("window.__daisy.run.state") == "idle"
        fill_settings(host, **RUN)
        assert host.page.inner_text("#err-batch") == "" and host.page.inner_text("#err-layers") == ""

        host.page.click("#start")
        # as the run starts, the phone sees the progress at the top of its window (issue 23)
        phone.wait("""(() => { const b = document.getElementById('runbar'); if (b.hidden) return false;
          const r = b.getBoundingClientRect(); return r.height > 0 && r.top >= 0 && r.bottom < innerHeight; })()""", 30_000)
        for t in (host, phone):
            t.wait("window.__daisy.run.step >= 3 && window.__daisy.chart.loss.length >= 3", 120_000)
        assert phone.page.evaluate(NO_SIDE_SCROLL)  # mid-run, the phone still fits
        host.wait("document.getElementById('step-rate').textContent.includes('steps/')", 30_000)
        assert "micro-batches/s" in host.page.inner_text("#peers")
        assert "mb/s" not in host.page.inner_text("body")
        for t in (host, phone):
            t.wait("window.__daisy.run.state === 'done'", 180_000)
            t.wait("!document.getElementById('end-card').hidden")
        assert phone.page.evaluate(NO_SIDE_SCROLL)
        # both end cards say who computed how much alike, adding up to the run's micro-batches;
        # the card holds the focus; only the host is offered "Back to settings" (issue 23)
        cards = [{w["id"]: w["micro"] for w in t.state("window.__daisy.end.who")} for t in (host, phone)]
        assert cards[0] == cards[1] and sum(cards[0].values()) == RUN["steps"] * RUN["batch"] // RUN["micro_batch"], cards
        for t in (host, phone):
            assert t.page.evaluate("document.activeElement.id") == "end-card"
        assert host.page.is_visible("#back-to-settings") and not phone.page.is_visible("#back-to-settings")

        # the run trained on the host's file, and the end card's command makes the same hash
        identity = host.page.evaluate("window.__daisy.mesh.peer.identity")
        assert identity["dataset"] == up["fingerprint"]
        ref = json.loads(subprocess.run(
            [str(CLI), "train", "--task", "text", "--data", "poem.txt", "--layers", RUN["layers"],
             "--steps", str(RUN["steps"]), "--seed", str(RUN["seed"]), "--batch", str(RUN["batch"]),
             "--micro-batch", str(RUN["micro_batch"]), "--lr", str(RUN["lr"]), "--json"],
            cwd=tmp_path, capture_output=True, text=True, check=True).stdout)
        for t in (host, phone):
            assert t.page.inner_text("#end-sha") == ref["params_sha256"]
        phone.wait("document.getElementById('end-command').textContent.includes('--data')", 30_000)
        command = host.page.inner_text("#end-command")
        assert command == phone.page.inner_text("#end-command")
        argv = shlex.split(command)
        assert argv[:2] == ["daisychain", "train"] and "--data" in argv and "poem.txt" in argv, command
        shown = json.loads(subprocess.run([str(CLI), *argv[1:], "--json"], cwd=tmp_path,
                                          capture_output=True, text=True, check=True).stdout)
        assert shown["params_sha256"] == ref["params_sha256"]
        who = host.page.inner_text("#end-who")
        assert "Laptop" in who and "Phone" in who and "micro-batches" in who, who
        assert host.page.inner_text("#end-accuracy").endswith("%")
        assert phone.page.is_visible("#end-download")
        with host.page.expect_download() as dl:
            host.page.click("#end-download")
        assert dl.value.suggested_filename.endswith(".pt")

        # back to settings for the next run
        host.page.click("#back-to-settings")
        assert not host.page.is_visible("#end-card")
        assert not host.page.is_disabled("#start")
        assert host.page.evaluate("document.getElementById('settings').contains(document.activeElement)")
        # no device id in what the page said, only names
        events = " ".join(host.state("window.__daisy.events"))
        for ident in (pid, host.id):
            assert ident not in events, events
    finally:
        for t in made:
            t.close()


def test_enter_in_the_code_box_asks_to_join_and_a_denied_tab_sees_its_banner(browser_cpu, tabs):
    host = tabs(browser_cpu, "host").open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    code = host.state(f"{ROOM_OF}.code")
    nope = tabs(browser_cpu, "nope").open()
    nope.page.fill("#join-code", code.lower().replace("-", ""))
    nope.page.press("#join-code", "Enter")
    nope.wait("window.__daisy.pending !== null")
    assert nope.page.is_visible("#waiting")
    host.wait("document.querySelectorAll('#approvals li[data-peer]').length === 1")
    host.page.click("#approvals li[data-peer] button.deny")
    nope.wait("window.__daisy.denied !== null")
    banner = nope.page.locator("#room-error")
    assert banner.is_visible() and "Not let in" in banner.inner_text()
    assert not nope.page.is_visible("#waiting")
    # a bad code is said by the box, and nothing is sent
    nope.page.fill("#join-code", "hello")
    nope.page.press("#join-code", "Enter")
    assert nope.page.is_visible("#room-error")
    assert nope.state("window.__daisy.pending") is None


@pytest.mark.parametrize("width", [390, 1280])
def test_no_sideways_scroll_and_no_emoji(width, browser_cpu, tabs):
    t = tabs(browser_cpu, f"w{width}")
    t.page.set_viewport_size({"width": width, "height": 900})
    t.open("create=1")
    t.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private'")
    t.wait("!document.getElementById('share-box').hidden")
    assert t.page.evaluate(NO_SIDE_SCROLL), t.page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    # the logo is an inline SVG; no character anywhere needs an emoji font
    assert t.page.locator("header svg.logo").count() == 1
    text = t.page.evaluate("document.documentElement.outerHTML")
    assert not [c for c in text if ord(c) >= 0x1F000 or 0x2600 <= ord(c) <= 0x27BF], "emoji on the page"
    # the tab order starts with the room's controls, every control is reachable
    names = []
    for _ in range(6):
        t.page.keyboard.press("Tab")
        names.append(t.page.evaluate("document.activeElement.id || document.activeElement.textContent"))
    assert "copy-link" in names and "create-room" in names, names


@needs_netns
def test_the_room_shows_links_counters_and_agreeing_hashes(browser_cpu, tabs):
    """Depends on the data the mesh publishes (room:links, room:peers, counters)."""
    from daisychain.engine.counters import unit_counts
    from daisychain.engine.spec import ModelSpec

    host = tabs(browser_cpu, "host").open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    code = host.state(f"{ROOM_OF}.code")
    guest = tabs(browser_cpu, "guest").open(f"room={code}")
    host.wait("document.querySelectorAll('#approvals li[data-peer]').length === 1")
    host.page.click("#approvals li[data-peer] button.approve")
    gid, hid = guest.id, host.id
    host.wait(f"window.__daisy.links['{gid}'] === 'open'", 60_000)
    # 40 steps: the peers' params hashes are reported about once a second (as test_links.py)
    fill_settings(host, steps=40, seed=1, batch=32, micro_batch=8, hidden=16)
    host.page.select_option("#settings select[name=task]", "digits")
    host.page.click("#start")
    for t in (host, guest):
        t.wait("window.__daisy.run.state === 'done'", 180_000)
    # the matrix: every pair open with a round trip, on both tabs (from room:links)
    for t in (host, guest):
        t.wait("window.__daisy.matrix !== null", 30_000)
        # rows are reported about once a second: a run shorter than that can end before the
        # first report that sees the link open, or before the one that carries the pair's first
        # round trip (getStats has none until the first STUN check answers): wait for it (it
        # must come)
        sel = f"#link-matrix td[data-a='{hid}'][data-b='{gid}']"
        t.wait(f"(c => c?.dataset.state === 'open' && c.textContent.endsWith(' ms'))"
               f"(document.querySelector(\"{sel}\"))", 30_000)
        cell = t.page.locator(sel)
        assert cell.get_attribute("data-state") == "open"
        assert cell.inner_text().endswith(" ms"), cell.inner_text()
    # the counters: the formula of the model shape for the micro-batches done
    spec = ModelSpec.from_json(host.page.evaluate("window.__daisy.mesh.peer.identity.model"))
    micro = 40 * (32 // 8)
    want = unit_counts(spec, 8, micro)
    for t in (host, guest):
        shown = {k: int(t.page.get_attribute(f"#count-{k}", "data-value") or -1)
                 for k in ("multiply", "requantize", "relu", "micro")}
        assert shown == {**want, "micro": micro}, shown
        seen = t.state("window.__daisy.counterSteps")  # they grew live, step by step
        assert len(seen) >= 2 and seen == sorted(set(seen)) and seen[-1] == micro, seen
    # the peers table: each row's hash agrees, the pooled capacity is shown
    host.wait("document.querySelectorAll('#peers td.state-agrees').length === 2", 30_000)
    assert "micro-batches/s" in host.page.inner_text("#pooled")


def _luminance(hex_colour: str) -> float:
    h = hex_colour.strip().lstrip("#")
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    rgb = [int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_colours_have_enough_contrast_in_both_schemes(scheme, browser_cpu, tabs):
    """WCAG AA (4.5:1) for every text colour on the backgrounds it is drawn on."""
    t = tabs(browser_cpu, f"c-{scheme}")
    t.page.emulate_media(color_scheme=scheme)
    t.open()
    v = t.page.evaluate("""() => { const s = getComputedStyle(document.documentElement);
        return Object.fromEntries(['ink', 'muted', 'accent', 'on-accent', 'ok', 'bad', 'card', 'bg',
          'soft', 'notice', 'focus'].map((k) => [k, s.getPropertyValue('--' + k).trim()])); }""")
    pairs = [("ink", "card"), ("ink", "bg"), ("ink", "soft"), ("ink", "notice"), ("muted", "card"),
             ("muted", "bg"), ("muted", "soft"), ("accent", "card"), ("on-accent", "accent"),
             ("ok", "card"), ("ok", "soft"), ("bad", "card"), ("focus", "card")]
    low = {f"{a} on {b}": round(_contrast(v[a], v[b]), 2) for a, b in pairs if _contrast(v[a], v[b]) < 4.5}
    assert not low, low
    bg = t.page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert (bg == "rgb(20, 21, 23)") == (scheme == "dark"), bg  # the dark scheme is the system's
