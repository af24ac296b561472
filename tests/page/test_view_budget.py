"""The page's live views of a run (the accuracy curve, the gallery) each have a budget of the
compute worker's time (webui/page/panels/eval_budget.js): after a view took d ms, it may
start again only d * (1 / share - 1) ms later; the two shares add up to SHARE. A run's first
FREE_VIEWS points of each view are taken at their steps whatever they cost (a 30-step run's
chart still shows 4 accuracy points: tests/browser/test_page_fixes.py).
Taken every few steps whatever they cost, they took ~30% of a solo tab's step."""

from __future__ import annotations

from jsrun import run_js


def test_a_view_that_took_d_waits_nine_d_before_the_next():
    got = run_js("""
      let t = 1000;
      const b = new B.ViewBudget(0.1, () => t);
      const out = [b.due()];
      await b.charge(async () => { t += 50; return 7; });   // a view of 50 ms, ending at 1050
      out.push(b.due());                                       // not before 1050 + 450
      t = 1499; out.push(b.due());
      t = 1500; out.push(b.due());
      await b.charge(async () => { t += 10; });               // a cheap one: 90 ms after it
      t = 1599; out.push(b.due());
      t = 1600; out.push(b.due());
      let threw = false;                                       // a view that fails is charged too
      try { await b.charge(async () => { t += 100; throw new Error("x"); }); } catch { threw = true; }
      out.push(threw, b.notBefore, B.SHARE, B.accuracyView.share + B.galleryView.share);
      t = 1800;  // within the budget's wait: a run's first FREE_VIEWS views go whatever they cost
      out.push([0, 1, 2, 3, 4].map((taken) => b.due(taken)), B.FREE_VIEWS);
      console.log(JSON.stringify(out));
    """, imports={"B": "page/panels/eval_budget.js"})
    assert got == [True, False, False, True, False, True, True, 1700 + 900, 0.1, 0.1,
                   [True, True, True, True, False], 4]


def test_a_view_waits_for_the_step_s_compute_and_is_not_charged_for_the_wait():
    """With `before` (the mesh's computeIdle), a view starts only once the computes queued
    before it are done, so that it never sits on the compute worker ahead of the step's own
    share; the wait is not charged (only the view's own time is)."""
    got = run_js("""
      let t = 0;
      const b = new B.ViewBudget(0.1, () => t);
      const order = [];
      let release;
      const compute = new Promise((r) => { release = r; }).then(() => { order.push("compute"); });
      const view = b.charge(async () => { order.push("view"); t += 20; return 3; }, () => compute);
      await new Promise((r) => setTimeout(r, 5));
      order.push("still waiting");
      t = 500;          // the compute took 500 ms
      release();
      const got = await view;
      console.log(JSON.stringify([order, got, b.notBefore]));
    """, imports={"B": "page/panels/eval_budget.js"})
    assert got == [["still waiting", "compute", "view"], 3, 520 + 180]
