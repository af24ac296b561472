"""The page (``/``) against the real server: device self-test, private rooms with host
approval, deny, and a direct WebRTC data channel between two approved tabs."""

from __future__ import annotations

import pytest
from mesh_helpers import needs_netns

pytestmark = pytest.mark.browser

ROOM_OF = "window.__daisy.room"


def test_device_panel_says_what_computes_and_why(browser_webgpu, browser_cpu, tabs):
    gpu = tabs(browser_webgpu, "gpu-tab").open()
    cpu = tabs(browser_cpu, "cpu-tab").open()
    g, c = gpu.state("window.__daisy.device"), cpu.state("window.__daisy.device")
    assert g["kind"] == "webgpu", g["reason"]
    assert "WebGPU passed its self-test" in gpu.page.inner_text("#device-reason")
    assert c["kind"] == "cpu"
    assert "no WebGPU" in cpu.page.inner_text("#device-reason")
    assert "WebAssembly SIMD passed its self-test" in cpu.page.inner_text("#device-reason")
    for t in (gpu, cpu):
        assert t.state("window.__daisy.device.capacity") > 0
        assert "micro-batches/s" in t.page.inner_text("#device-capacity")
    # without ?room= a tab is in its network room
    gpu.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'network'")


def test_private_room_approve_and_deny(browser_cpu, tabs):
    host = tabs(browser_cpu, "host").open()
    host.page.click("#create-room")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    code = host.state(f"{ROOM_OF}.code")
    assert host.page.inner_text("#room-code") == code
    assert f"?room={code}" in host.page.inner_text("#room-link")
    assert host.page.is_visible("#approvals-panel")

    guest = tabs(browser_cpu, "guest").open(f"room={code}")
    guest.wait("window.__daisy.pending !== null")
    assert guest.page.is_visible("#waiting")
    assert guest.state(ROOM_OF) is None  # a waiting device learns nothing about the room
    host.wait("document.querySelectorAll('#approvals li[data-peer]').length === 1")
    row = host.page.inner_text("#approvals li[data-peer]")
    assert "guest" in row and "CPU tab" in row and "micro-batches/s" in row
    host.page.click("#approvals li[data-peer] button.approve")
    guest.wait(f"{ROOM_OF} && {ROOM_OF}.code === '{code}' && {ROOM_OF}.members.length === 2")
    assert not guest.page.is_visible("#waiting")
    host.wait(f"{ROOM_OF}.members.length === 2 && {ROOM_OF}.pending.length === 0")

    nope = tabs(browser_cpu, "nope").open(f"room={code}")
    nope.wait("window.__daisy.pending !== null")
    host.wait("document.querySelectorAll('#approvals li[data-peer]').length === 1")
    host.page.click("#approvals li[data-peer] button.deny")
    nope.wait("window.__daisy.denied !== null")
    assert "declined" in nope.page.inner_text("#room-error")
    assert not nope.page.is_visible("#waiting")
    # the guest never had to wait on the denied one, and the room is still two
    assert len(host.state(f"{ROOM_OF}.members")) == 2


def test_unknown_room_code_is_a_clear_message(browser_cpu, tabs):
    t = tabs(browser_cpu, "lost").open("room=ZZZZ-ZZZZ-ZZ")
    t.wait("window.__daisy.error !== null")
    assert "there is no room ZZZZ-ZZZZ-ZZ" in t.page.inner_text("#room-error")


@needs_netns
def test_two_approved_tabs_open_a_data_channel(browser_webgpu, browser_cpu, tabs):
    host = tabs(browser_webgpu, "a").open("create=1&debug=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.isHost && {ROOM_OF}.room === 'private'")
    code = host.state(f"{ROOM_OF}.code")
    guest = tabs(browser_cpu, "b").open(f"room={code}")
    host.wait("document.querySelectorAll('#approvals li[data-peer]').length === 1")
    host.page.click("#approvals li[data-peer] button.approve")
    gid = guest.id
    hid = host.id
    host.wait(f"window.__daisy.links['{gid}'] === 'open'", 60_000)
    guest.wait(f"window.__daisy.links['{hid}'] === 'open'", 60_000)
    assert host.page.inner_text(f"#peers tr[data-peer='{gid}'] td:nth-child(4)") == "open"


@pytest.mark.parametrize("tamper", ["adam", "subnormal"])
def test_a_tab_whose_float_self_test_fails_says_so_and_stays_out(tamper, browser_cpu, tabs,
                                                                 server_url):
    """The tab runs one Adam step on the golden Adam vectors and the golden subnormal
    operations (/golden/selftest.json). Served a tampered vector, it says in words what
    differs and never joins a room; the untampered page passes (the test above)."""
    bad = tabs(browser_cpu, f"bad-{tamper}")

    def tampered(route):
        golden = route.fetch().json()
        if tamper == "adam":
            v = golden["adam"][0]["out"]["v"]
            v[2] = "0000000000000000"  # v[2] is subnormal: as if the device flushed it
            golden["adam"][0]["out"]["v_sha256"] = "0" * 64
        else:
            golden["subnormal"][0]["out"] = "0000000000000000"
        route.fulfill(json=golden)
    bad.page.route("**/golden/selftest.json", tampered)
    bad.page.goto(f"{server_url}/?name=bad-{tamper}")
    bad.wait("window.__daisy && window.__daisy.error !== null", 120_000)
    text = bad.page.inner_text("#status")
    assert "cannot train" in text and "float64 arithmetic failed the self-test" in text, text
    if tamper == "adam":
        assert "Adam step (default hyper, step 4): v hashes to" in text and "v[2] is" in text, text
    else:
        assert "subnormals: mul(0000000000000001, 4000000000000000) is 0000000000000002 here, " \
               "golden 0000000000000000" in text, text
    assert bad.state("window.__daisy.room") is None and bad.state("window.__daisy.id") is None
