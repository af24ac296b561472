"""The page's data on the bus (bus.js), between two real tabs over real WebRTC: each tab's
own links (`links`, state and round-trip time), the room's matrix (`room:links`, shared
through the server's broadcast), the peers table's data (`room:peers`: capacity, share,
micro-batches, hash agreement, step rate), the unit counters (`counters`, equal to
engine/counters.py for the steps done), and events that name devices by name: a stop by the
host (`run:stopped`), a hand-over (`run:handover`) and a peer leaving (`room:left`)."""

from __future__ import annotations

import pytest
from mesh_helpers import EV, RECORD, needs_netns

from daisychain.engine.counters import unit_counts
from daisychain.engine.spec import mlp

pytestmark = [pytest.mark.browser, pytest.mark.mesh, needs_netns]

ROOM_OF = "window.__daisy.room"


def _room_of_two(tabs, browser, host_name="host", guest_name="guest"):
    host = tabs(browser, host_name).open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    host.page.evaluate(RECORD)
    code = host.state(f"{ROOM_OF}.code")
    guest = tabs(browser, guest_name).open(f"room={code}")
    guest.page.evaluate(RECORD)
    host.page.wait_for_selector("#approvals li[data-peer] button.approve", timeout=60_000)
    host.page.click("#approvals li[data-peer] button.approve")
    guest.wait(f"{ROOM_OF} && {ROOM_OF}.members.length === 2")
    return host, guest


def _start(tab, settings: dict) -> None:
    tab.page.evaluate("(s) => { window.__started = window.__daisy.mesh.start(s).then(() => 'ok', (e) => e.message); }",
                      settings)


def test_links_matrix_peers_and_counters_of_two_tabs(browser_cpu, tabs):
    host, guest = _room_of_two(tabs, browser_cpu)
    hid, gid = host.id, guest.id
    # this tab's own link: open, with a round-trip time from getStats once ICE measured one
    for me, other in ((host, gid), (guest, hid)):
        me.wait(f"{EV}.links && {EV}.links.rows.some((r) => r.id === '{other}' && r.state === 'open')", 60_000)
    host.wait(f"{EV}.links.rows[0].rttMs !== null", 30_000)
    row = host.state(f"{EV}.links.rows[0]")
    assert row["id"] == gid and row["name"] == "guest" and 0 <= row["rttMs"] < 1000
    # the matrix: each tab sees both directions open (the other's row came over the server)
    for t in (host, guest):
        t.wait(f"(m => m['{hid}'] && m['{gid}'] && m['{hid}']['{gid}'] && m['{gid}']['{hid}'] && "
               f"m['{hid}']['{gid}'].state === 'open' && m['{gid}']['{hid}'].state === 'open')"
               f"({EV}['room:links'].matrix)", 30_000)
        rl = t.state(f"{EV}['room:links']")
        assert sorted(rl["members"]) == sorted([hid, gid])
        assert rl["names"] == {hid: "host", gid: "guest"}

    s = dict(task="digits", steps=40, seed=3, batch=64, micro_batch=8, lr=0.003, layers=[24])
    _start(host, s)
    for t in (host, guest):
        t.wait(f"{EV}['run:done'] && {EV}['run:done'].step === {s['steps']}", 120_000)
    assert host.page.evaluate("() => window.__started") == "ok"
    n_micro = s["batch"] // s["micro_batch"]
    want = unit_counts(mlp(64, [24], 10), s["micro_batch"], s["steps"] * n_micro)
    for t in (host, guest):
        c = t.state(f"{EV}['run:done'].counters")
        assert {k: c[k] for k in want} == want
        assert c["micro"] == s["steps"] * n_micro
        # every committed step's counters equal the formula for the steps done so far
        seen = t.state("window.__ev.all.counters")
        assert [x["step"] for x in seen] == list(range(1, s["steps"] + 1))
        for x in seen[::7]:
            f = unit_counts(mlp(64, [24], 10), s["micro_batch"], x["step"] * n_micro)
            assert {k: x[k] for k in f} == f
    # the peers table's data: both did work, shares add up, the micro-batches are the run's
    for t in (host, guest):
        t.wait(f"{EV}['room:peers'].rows.every((r) => r.hashAgrees === true)", 30_000)
        rp = t.state(f"{EV}['room:peers']")
        rows = {r["id"]: r for r in rp["rows"]}
        assert set(rows) == {hid, gid}
        assert rows[hid]["name"] == "host" and rows[hid]["host"] and not rows[gid]["host"]
        assert sum(r["micro"] for r in rows.values()) == s["steps"] * n_micro
        assert all(r["micro"] > 0 for r in rows.values()), rows
        assert abs(sum(r["share"] for r in rows.values()) - 1) < 1e-9
        assert rp["pooledCapacity"] == pytest.approx(sum(r["capacity"] for r in rows.values()))
        assert rp["step"] == rp["steps"] == s["steps"] and rp["etaSeconds"] == 0
        assert rp["stepRate"] > 0
    # the run's messages name devices, never by id
    for t in (host, guest):
        texts = t.state("[...(window.__ev.all['run:log'] || []).map((e) => e.text), "
                        "...(window.__ev.all['run:error'] || []).map((e) => e.message)]")
        assert texts, "no run:log events"
        assert not [x for x in texts if hid in x or gid in x], texts
    ready = [e for e in host.state("window.__ev.all['run:log']") if "is ready" in e["text"]]
    assert ready and ready[0]["name"] == "guest" and ready[0]["peer"] == gid
    prep = host.state("window.__ev.all['run:preparing'].map((e) => e.stage)")
    # the model stage says twice what it does: building the model, then measuring this
    # device on it (issue 36 item 5)
    stages = [st for i, st in enumerate(prep) if i == 0 or st != prep[i - 1]]
    assert stages == ["data", "model", "identity", "announce", "ready"], prep

    # the guest goes; the server's error about signaling it names it ("'<id>' is no other
    # connected member of your room" before), and the room says who left
    guest.close()
    host.wait(f"{EV}['room:left'] !== undefined", 30_000)
    assert host.state(f"{EV}['room:left']") == {"id": gid, "name": "guest"}
    host.page.evaluate("async (gid) => { const P = await import('/webui/wire/protocol.js'); "
                       "window.__daisy.mesh.net._signal(P.candidate(gid, null)); }", gid)
    host.wait(f"{EV}['net:error'] !== undefined", 30_000)
    e = host.state(f"{EV}['net:error']")
    assert e["message"] == "guest is no other connected member of your room"
    assert e["peer"] == gid and e["name"] == "guest"


def test_stop_handover_and_leaving_are_said_with_names(browser_cpu, tabs):
    host, guest = _room_of_two(tabs, browser_cpu, "alice", "bob")
    hid, gid = host.id, guest.id
    guest.wait(f"{EV}.links && {EV}.links.rows.some((r) => r.state === 'open')", 60_000)
    host.wait(f"{EV}.links && {EV}.links.rows.some((r) => r.state === 'open')", 60_000)
    s = dict(task="digits", steps=100000, seed=1, batch=64, micro_batch=16, lr=0.003, layers=[16])
    _start(host, s)
    guest.wait(f"{EV}['run:step'] && {EV}['run:step'].step >= 5", 60_000)
    host.page.evaluate("() => window.__daisy.mesh.stop()")
    guest.wait(f"{EV}['run:stopped'] !== undefined", 60_000)
    st = guest.state(f"{EV}['run:stopped']")
    assert st["by"] == hid and st["byName"] == "alice" and st["step"] >= 5
    assert "alice" in st["text"] and hid not in st["text"]
    host.wait(f"{EV}['run:stopped'] !== undefined && {EV}['run:done'] !== undefined", 60_000)
    assert host.state(f"{EV}['run:stopped'].by") == hid

    # a second run; the host goes away in the middle: the guest takes over, in words
    _start(host, dict(s, steps=400, seed=2))
    guest.wait(f"{EV}['run:step'] && {EV}['run:step'].steps === 400 && {EV}['run:step'].step >= 5", 60_000)
    host.close()
    guest.wait(f"{EV}['run:handover'] !== undefined", 60_000)
    h = guest.state(f"{EV}['run:handover']")
    assert h["you"] is True and h["host"] == gid and h["hostName"] == "bob"
    assert h["text"].startswith("you are now the host: the run goes on from step")
    guest.wait(f"{EV}['room:left'] !== undefined", 60_000)
    assert guest.state(f"{EV}['room:left']") == {"id": hid, "name": "alice"}
    guest.wait(f"{EV}['run:done'] && {EV}['run:done'].step === 400", 120_000)
    rp = guest.state(f"{EV}['room:peers']")
    rows = {r["id"]: r for r in rp["rows"]}
    assert rows[gid]["host"] and not rows[gid]["left"]
    # the host that left did work in this run: still a row, marked as gone
    assert rows[hid]["left"] and rows[hid]["name"] == "alice" and rows[hid]["micro"] > 0
    assert rows[hid]["capacity"] == 0 and rp["pooledCapacity"] == rows[gid]["capacity"]
    assert rows[gid]["micro"] + rows[hid]["micro"] == 400 * 4
