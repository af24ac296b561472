// Small helpers of the run protocol (webui/run/): output constructors (outputs.js, generated
// from the protocol table; send and log re-exported for the roles) and the formatting that
// makes log lines read the same as daisychain/peer/run/'s.

export { log, send, setting } from "./outputs.js";


/** Python's format(x, ".3g"), for log lines that read the same in both languages. */
export function g3(x) {
  if (x === 0) return "0";
  const exp = Math.floor(Math.log10(Math.abs(Number(x.toPrecision(3)))));
  if (exp < -4 || exp >= 3) {
    const [m, e] = x.toExponential(2).split("e");
    const mm = m.includes(".") ? m.replace(/0+$/, "").replace(/\.$/, "") : m;
    const n = Number(e);
    return `${mm}e${n < 0 ? "-" : "+"}${String(Math.abs(n)).padStart(2, "0")}`;
  }
  const t = x.toFixed(Math.max(0, 2 - exp));
  return t.includes(".") ? t.replace(/0+$/, "").replace(/\.$/, "") : t;
}

/** Python's repr of a list of ints. */
export const pyList = (a) => `[${a.join(", ")}]`;
export const sameInts = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * intcodec.py past_bound: a value of `ints` whose magnitude is over `bound`, or null. The
 * largest value is reported if it is over, else the negated smallest: both ends compared,
 * never an absolute value (DETERMINISM rule 14; the Python side's int64 `abs(-2**63)` is
 * negative).
 */
export function pastBound(ints, bound) {
  if (!ints.length) return null;
  let hi = -Infinity, lo = Infinity;
  for (let i = 0; i < ints.length; i++) { const v = ints[i]; if (v > hi) hi = v; if (v < lo) lo = v; }
  if (hi > bound) return hi;
  if (lo < -bound) return -lo;
  return null;
}
