"""The page shows pictures (issue 19, "What to build" 6): a tab hosting an image run shows a
grid of fixed test images with the model's predicted class (wrong ones marked by colour and
text), refreshed while the run goes and at its end, and the end card's confusion matrix over
the whole test set; computing them leaves the run's parameters as they are."""

from __future__ import annotations

import pytest
from conv_server import serving
from test_conv_selftest import image_set

pytestmark = pytest.mark.browser

STEPS = 12

SHA_NOW = """async () => {
  const { paramsSha256 } = await import('/webui/engine/trainer.js');
  return paramsSha256(window.__daisy.mesh.peer.trainer.theta);
}"""


@pytest.fixture(scope="module")
def gallery_server():
    """The real server with a small image set given at start (as `serve --image-data` does)."""
    with serving({"image": image_set("image", 1, 12, 12, n_train=160, n_test=40)}) as url:
        yield url


def test_a_solo_image_run_shows_the_gallery_and_the_confusion_matrix(cpu_page, gallery_server):
    page = cpu_page
    page.goto(f"{gallery_server}/?name=solo&path=cpu")
    page.wait_for_function("window.__daisy && window.__daisy.ready && window.__daisy.id && window.__daisy.datasetsLoaded",
                           timeout=120_000)
    page.click("#create-room")
    page.wait_for_function("window.__daisy.room && !document.querySelector('#start').disabled", timeout=60_000)
    page.select_option("#f-task", "image")
    fp = page.evaluate("window.__daisy.datasets.find((d) => d.origin === 'server' && d.task === 'image').fingerprint")
    page.select_option("#f-dataset", fp)
    page.fill("#f-steps", str(STEPS))
    page.fill("#f-layers", "conv4,pool")
    page.click("#start")
    page.wait_for_function("window.__daisy.end && !document.querySelector('#end-confusion').hidden", timeout=180_000)
    page.wait_for_function(f"window.__daisy.galleryShown.includes({STEPS})", timeout=60_000)
    assert page.evaluate("window.__daisy.mesh.peer.trainer.spec.layers.some((l) => l.type === 'conv2d')")

    # the grid: 24 fixed test images drawn from their pixels, each with the model's answer
    items = page.evaluate("""() => [...document.querySelectorAll('#gallery figure')].map((f) => ({
      row: +f.dataset.row, label: +f.dataset.label, pred: +f.dataset.pred, wrong: f.classList.contains('wrong'),
      text: f.querySelector('figcaption').textContent, w: f.querySelector('canvas').width,
      lit: (() => { const c = f.querySelector('canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let s = 0; for (let i = 0; i < d.length; i += 4) s += d[i]; return s; })() }))""")
    assert len(items) == 24 and len({i["row"] for i in items}) == 24
    labels = page.evaluate("Array.from(window.__daisy.mesh.peer.trainer.ds.y_test.data)")
    x = page.evaluate("Array.from(window.__daisy.mesh.peer.trainer.ds.x_test.data.subarray(0, 144 * 40))")
    for it in items:
        assert it["label"] == labels[it["row"]] and it["w"] == 12
        assert it["lit"] == sum(x[it["row"] * 144:(it["row"] + 1) * 144])  # the row's own pixels, drawn grey
        assert it["wrong"] == (it["pred"] != it["label"])
        assert it["text"] == (f"✗ {it['pred']} (should be {it['label']})" if it["wrong"] else f"✓ {it['pred']}")
    shown = page.evaluate("window.__daisy.galleryShown")
    assert shown[0] < STEPS and shown[-1] == STEPS, shown  # refreshed during the run, and at the end

    # the confusion matrix: classes x classes counts over the whole test set
    cells = page.evaluate("""() => [...document.querySelectorAll('#confusion td')].map((td) =>
      [+td.dataset.true, +td.dataset.pred, +td.dataset.count])""")
    assert len(cells) == 16
    assert sum(c for _, _, c in cells) == 40
    diag = sum(c for t, p, c in cells if t == p)
    acc = page.evaluate("window.__daisy.end.accuracy")
    assert diag == round(acc * 40)
    assert f"{diag} of the 40 test images right" in page.inner_text("#confusion-summary")
    # the end card's accuracy is the diagonal's share, and reading the model changed nothing
    assert page.evaluate(SHA_NOW) == page.evaluate("window.__daisy.run.sha")
