// What the gallery shows (panels/gallery.js): the model's predicted class of chosen test rows,
// and the confusion matrix of a whole split. Run in the compute worker (compute_worker.js ops
// "predict" and "confusion") or, where a browser has no module workers, on the page; the
// parameters are only read.

function split(tr, name) {
  if (name !== "test" && name !== "train") throw new Error(`no split ${name}`);
  return name === "test" ? { x: tr.ds.x_test, y: tr.ds.y_test } : { x: tr.ds.x_train, y: tr.ds.y_train };
}

/** Predicted classes (Int32Array) of rows `index` (ints) of a split, under parameters theta. */
export async function predictRows(tr, theta, name, index) {
  const { x, y } = split(tr, name);
  const N = y.data.length;
  const L = tr.rowLen;
  const rows = new x.data.constructor(index.length * L);
  index.forEach((i, k) => {
    if (!Number.isInteger(i) || i < 0 || i >= N) throw new Error(`no ${name} row ${i} (the split has ${N})`);
    rows.set(x.data.subarray(i * L, (i + 1) * L), k * L);
  });
  if (!index.length) return new Int32Array(0);
  return tr.engine.predict(theta, rows, L, index.length, tr.hp.micro_batch);
}

/** The confusion matrix of a split: counts[true * classes + predicted], with n and correct. */
export async function confusionOf(tr, theta, name) {
  const { x, y } = split(tr, name);
  const n = y.data.length;
  const C = tr.spec.classes;
  const counts = new Int32Array(C * C);
  const pred = n ? await tr.engine.predict(theta, x.data, tr.rowLen, n, tr.hp.micro_batch) : new Int32Array(0);
  let correct = 0;
  for (let i = 0; i < n; i++) {
    counts[y.data[i] * C + pred[i]] += 1;
    if (pred[i] === y.data[i]) correct++;
  }
  return { classes: C, counts, n, correct };
}
