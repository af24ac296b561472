"""Training on the host's own data: a text file uploaded from the host tab (/datasets/upload)
is trained by the host tab, a guest tab and a daisy-peer, and every replica ends on the hash
`daisychain train --task text --data FILE` gives (the entry's train_args). Members fetch the
run's data by its fingerprint (mesh.js `_fetch` asked for the embedded task's data before,
and the guest tab never joined). A dataset the server has no copy of, or a server whose copy
does not hash to the fingerprint, is refused in words before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mesh_helpers import EV, RECORD, log, needs_netns

pytestmark = [pytest.mark.browser, pytest.mark.mesh]

BIN = Path(sys.executable).parent
ROOM_OF = "window.__daisy.room"
TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, "
        "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
        "incredulity, it was the season of Light, it was the season of Darkness.\n") * 6
# through the page's own helper: it sends the room credential (issue 21: uploads belong to a room)
UPLOAD = """async (text) => {
  const { postUpload } = await import('/webui/shell/uploads.js');
  const r = await postUpload('/datasets/upload?name=book.txt', text);
  if (!r.ok) throw new Error(await r.text());
  return r.json();
}"""
# what a tab gets for (status, one-line reason) when it tries without being the host
TRY_UPLOAD = """async (text) => {
  const { postUpload } = await import('/webui/shell/uploads.js');
  const r = await postUpload('/datasets/upload?name=mine.txt', text);
  return [r.status, await r.text()];
}"""
# a fetch of the upload's data without the credential: what a stranger gets
BARE_FETCH = "(fp) => fetch('/data/text.dcds?fingerprint=' + fp).then((r) => r.status)"


def _host(tabs, browser, name="host"):
    host = tabs(browser, name).open("create=1")
    host.wait(f"{ROOM_OF} && {ROOM_OF}.room === 'private' && {ROOM_OF}.isHost")
    host.page.evaluate(RECORD)
    return host, host.state(f"{ROOM_OF}.code")


def _start(tab, settings: dict) -> str:
    return tab.page.evaluate("(s) => window.__daisy.mesh.start(s).then(() => 'ok', (e) => e.message)", settings)


@needs_netns
def test_uploaded_text_trains_to_the_daisychain_train_hash(browser_cpu, tabs, server_url, tmp_path):
    (tmp_path / "book.txt").write_text(TEXT)
    s = dict(steps=12, seed=5, batch=32, micro_batch=8, lr=0.003, layers=[32, 16])
    train_args = ["--task", "text", "--data", "book.txt"]
    # the reference, in the folder holding the file, meanwhile (the entry must name these flags)
    ref = subprocess.Popen([str(BIN / "daisychain"), "train", *train_args, "--steps", str(s["steps"]),
                            "--seed", str(s["seed"]), "--batch", str(s["batch"]), "--micro-batch",
                            str(s["micro_batch"]), "--lr", str(s["lr"]), "--layers", "32,16", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    peer = None
    try:
        host, code = _host(tabs, browser_cpu)
        peer = subprocess.Popen([str(BIN / "daisy-peer"), "--server", server_url, "--room", code, "--name", "py",
                                 "--json", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        entry = host.page.evaluate(UPLOAD, TEXT)
        assert entry["task"] == "text" and entry["origin"] == "upload"
        assert entry["train_args"] == train_args
        guest = tabs(browser_cpu, "guest").open(f"room={code}")
        guest.page.evaluate(RECORD)
        for name in ("guest", "py"):
            sel = f"#approvals li[data-peer]:has-text('{name}') button.approve"
            host.page.wait_for_selector(sel, timeout=120_000)
            host.page.click(sel)
        # the guest is a member, not the host: it may not upload (the reason in words), and
        # the data's fingerprint alone opens nothing
        guest.wait(f"{ROOM_OF} && {ROOM_OF}.members.length >= 2", 60_000)
        assert guest.page.evaluate(TRY_UPLOAD, TEXT) == [403, "only the room's host may upload data on this server (daisychain serve --uploads-by host)"]
        assert guest.page.evaluate(BARE_FETCH, entry["fingerprint"]) == 404
        host.wait("Object.values(window.__daisy.links).filter((s) => s === 'open').length === 2", 60_000)
        # daisy-peer shares its links too (daisychain/peer/links.py): its row reaches the tabs
        ids = {m["name"]: m["id"] for m in host.state(f"{ROOM_OF}.members")}
        guest.wait(f"(m => m && m['{ids['py']}'] && m['{ids['py']}']['{ids['host']}'] && "
                   f"m['{ids['py']}']['{ids['host']}'].state === 'open' && "
                   f"m['{ids['py']}']['{ids['guest']}'].state === 'open')({EV}['room:links']?.matrix)", 30_000)
        assert _start(host, dict(s, dataset=entry)) == "ok"
        for t in (host, guest):
            t.wait(f"{EV}['run:done'] !== undefined", 180_000)
        out, err = peer.communicate(timeout=120)
        for line in err.splitlines():
            log.info("[py] %s", line)
        assert peer.returncode == 0, err[-2000:]
        py = json.loads(out.strip().splitlines()[-1])
        ref_out, ref_err = ref.communicate(timeout=300)
        assert ref.returncode == 0, ref_err
        want = json.loads(ref_out)
    finally:
        for proc in (peer, ref):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert py["params_sha256"] == want["params_sha256"] and py["identity"]["dataset"] == entry["fingerprint"]
    for t in (host, guest):
        done = t.state(f"{EV}['run:done']")
        assert done["sha"] == want["params_sha256"] and done["agreed"] and done["step"] == s["steps"], t.name
    assert host.state("window.__daisy.mesh.peer.run.run_id") == want["run_id"]
    # the guest fetched the uploaded set by its fingerprint, from the server with its room's
    # credential (not from the host over a data channel), and did its share
    logs = [e.get("text", "") for e in guest.state("window.__ev.all['run:log'] || []")]
    assert not [t for t in logs if "asking the host for the data" in t], logs
    rows = {r["name"]: r for r in host.state(f"{EV}['room:peers'].rows")}
    assert rows["guest"]["micro"] > 0 and rows["py"]["micro"] > 0
    assert sum(r["micro"] for r in rows.values()) == s["steps"] * s["batch"] // s["micro_batch"]


def test_a_dataset_the_server_lacks_or_misstates_is_refused_in_words(browser_cpu, tabs):
    host, _ = _host(tabs, browser_cpu, "lone")
    entry = host.page.evaluate(UPLOAD, TEXT)
    missing = dict(entry, fingerprint="ab" * 32, name="gone.txt")
    msg = _start(host, dict(steps=3, layers=[8], dataset=missing))
    assert msg == "the dataset gone.txt (fingerprint abababababab…): the server has no copy of it"
    assert _start(host, dict(steps=3, layers=[8], dataset=dict(entry, fingerprint="nothex"))) == \
        "the chosen dataset has no valid fingerprint (a /datasets entry has one)"
    # a server (or anything between) that answers with other bytes than the fingerprint's
    other = TEXT.replace("times", "tides").encode()  # the hash is checked before anything is parsed
    host.page.route("**/data/text.dcds?fingerprint=*",
                    lambda route: route.fulfill(status=200, body=other, content_type="application/octet-stream"))
    msg = _start(host, dict(steps=3, layers=[8], dataset=entry))
    assert msg.startswith("the dataset book.txt: the server's copy hashes to ")
    assert msg.endswith(f"not the fingerprint {entry['fingerprint'][:12]}… the run names")
    assert host.state("window.__daisy.mesh.peer.run") is None  # nothing started
    host.page.unroute("**/data/text.dcds?fingerprint=*")
    assert _start(host, dict(steps=3, layers=[8], dataset=entry)) == "ok"
    host.wait(f"{EV}['run:done'] && {EV}['run:done'].step === 3", 60_000)
