// Spot-checks as pure functions (daisychain/peer/run/checks.py): which micro-batches of a step are
// checked, and the verdict over the answers a check got.

import { sha256Bytes } from "../units/sha256.js";
import { sameInts } from "./util.js";

/**
 * run/checks.py checked_micro: micro-batch j of `step` is spot-checked when the first 8 bytes of
 * SHA-256(`key:step:j`), as a big-endian u64, are below floor(rate * 2^64).
 */
export function checkedMicro(key, step, nMicro, rate) {
  const bound = BigInt(Math.floor(rate * 2 ** 64));
  const enc = new TextEncoder();
  const out = [];
  for (let j = 0; j < nMicro; j++) {
    const h = sha256Bytes(enc.encode(`${key}:${step}:${j}`));
    let v = 0n;
    for (let i = 0; i < 8; i++) v = (v << 8n) | BigInt(h[i]);
    if (v < bound) out.push(j);
  }
  return out;
}

/**
 * run/checks.py verdict: the decision on a spot-checked micro-batch from its answers so far
 * (`votes`: Map peer -> integer contribution, in the order they came): ["decide", peer],
 * ["wait", null] or ["referee", sorted peers]. All equal: decided once two or more agree,
 * or one when nobody else can still answer. Different: the coordinator's own answer is the
 * reference (it referees), never two peers that agree: two liars that lie alike outvoted an
 * honest peer and had it struck (bench.simulate seed 1264).
 */
export function verdict(votes, me, stillOpen, refereed) {
  const values = []; // [{ints, peers}] in the order of first appearance
  for (const [peer, ints] of votes) {
    const hit = values.find((x) => sameInts(x.ints, ints));
    if (hit) hit.peers.push(peer);
    else values.push({ ints, peers: [peer] });
  }
  if (values.length === 1) {
    if (votes.size >= 2 || !stillOpen) return ["decide", votes.keys().next().value];
    return ["wait", null];
  }
  if (votes.has(me)) return ["decide", me];
  if (refereed) return ["wait", null];
  return ["referee", [...votes.keys()].sort()];
}
