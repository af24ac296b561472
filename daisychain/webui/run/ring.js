// The ring aggregator (daisychain/peer/run/ring.py, rule for rule; docs/MESH.md "The ring"):
// a step's integer contributions summed by reduce-scatter + all-gather over the members' own
// data channels. Chunk c of a vector of `size` values is [c*size//n, (c+1)*size//n); member i
// sends to i+1: reduce-scatter rounds r = 0..n-2 send the partial sum of chunk (i-r) mod n
// and add chunk (i-1-r) mod n; all-gather rounds send chunk (i+1-r) mod n of the total and
// keep chunk (i-r) mod n. Every incoming chunk is checked (term, step, ring, sender = the
// ring predecessor, its place in the sequence, its chunk, its length, the clamp bound).
// Used only when the run checks nothing (verify rate 0) and every member's kind is in
// RING_KINDS. A local-steps round between anchors is summed over its P deltas alone (ringSize:
// its moment blocks are zero by rule, the total is padded with zeros); an anchor round by the
// star (the coordinator checks each contribution's inner moments, which a ring would hide).
// This file is the ring itself and the choice; the protocol's two sides, RingMember (owned by
// the Member) and RingCoordinator (owned by the Coordinator), are in ring_roles.js, behind the
// aggregation interfaces of aggregator.js that the roles call (aggregation).

import { g3, pastBound } from "./util.js";

export const AGGREGATES = ["auto", "star", "ring"];
/** Member kinds (their ready) that take part in a ring: daisy-peer and the page's two. */
export const RING_KINDS = ["python", "cpu", "webgpu"];
/** Extra seconds a ring gets over its slowest member's task deadline. */
export const RING_SLACK_S = 2.0;
// the cost model (ring.py): a hop between two peer processes, one more member at the star's
// coordinator, seconds per wire byte, wire bytes per parameter (measured: docs/BENCHMARKS.md)
export const STAR_HOP_S = 7.7e-3;
export const RING_HOP_S = 5.3e-3;
export const MEMBER_S = 1.2e-3;
export const LINK_B_S_PER_BYTE = 55e-9;
export const BYTES_PER_VALUE = 1.5;
/** Wire bytes per parameter delta of a local-steps round between anchors (ring.py). */
export const LOCAL_BYTES_PER_VALUE = 4.0;

export function chunkBounds(size, n) {
  return Array.from({ length: n }, (_, c) => [Math.floor((c * size) / n), Math.floor(((c + 1) * size) / n)]);
}

export function starSeconds(n, micro, c, size, h = STAR_HOP_S, s = MEMBER_S, b = LINK_B_S_PER_BYTE, w = BYTES_PER_VALUE) {
  const v = size * w;
  return Math.ceil(micro / n) * c + 2 * h + (n - 1) * (s + 2 * v * b);
}

export function ringSeconds(n, micro, c, size, h = RING_HOP_S, b = LINK_B_S_PER_BYTE, w = BYTES_PER_VALUE) {
  const v = size * w;
  return Math.ceil(micro / n) * c + (2 * n - 1) * h + (2 * (n - 1) * b * v) / n;
}

/** The entries a ring of `step` sums: a local-steps round between anchors, its P deltas;
 * any other step, the whole contribution (ring.py ring_size). */
export function ringSize(trainer, step) {
  if (trainer.totalSize !== trainer.layout.size && !trainer.isAnchor(step)) return trainer.layout.size;
  return trainer.totalSize;
}

/** [star | ring, why in words] for a step of n devices summing `size` entries (`local`: a
 * round of a local-steps run; `anchor`: one whose contributions carry the inner moments,
 * always by the star; ring.py choose). */
export function choose(aggregate, verifyRate, n, micro, c, size, local = false, anchor = false) {
  if (n < 2) return ["star", "1 device"];
  if (local && anchor && aggregate !== "star") {
    return ["star", `${n} devices, a local-steps anchor round (the coordinator checks each contribution's inner moments, which a ring would hide)`];
  }
  if (verifyRate > 0) return ["star", `${n} devices, spot-checks at rate ${g3(verifyRate)} (a ring would hide the contributions from them)`];
  const rounds = local ? "; anchor rounds by the star" : "";
  if (aggregate === "ring") return ["ring", `${n} devices, no spot-checks (--aggregate ring)${rounds}`];
  if (aggregate === "star") return ["star", `${n} devices (--aggregate star)`];
  const [w, unit] = local ? [LOCAL_BYTES_PER_VALUE, "round"] : [BYTES_PER_VALUE, "step"];
  const s = starSeconds(n, micro, c, size, STAR_HOP_S, MEMBER_S, LINK_B_S_PER_BYTE, w);
  const r = ringSeconds(n, micro, c, size, RING_HOP_S, LINK_B_S_PER_BYTE, w);
  const model = `the cost model: star ${(s * 1e3).toFixed(2)} ms, ring ${(r * 1e3).toFixed(2)} ms a ${unit}`;
  if (r < s) return ["ring", `${n} devices, no spot-checks; ${model}${rounds}`];
  return ["star", `${n} devices; ${model}`];
}

export class RingError extends Error {}

/** One replica's part in one ring (one step, one ring number): plain state, no I/O. */
export class Ring {
  /** `size`: the entries summed (ringSize); `full`: the total's entries, the rest zeros. */
  constructor(term, step, ring, peers, me, size, bound, full = size) {
    Object.assign(this, { term, step, ring, bound, size, full });
    this.peers = [...peers];
    this.n = this.peers.length;
    this.i = this.peers.indexOf(me);
    this.prev = this.peers[(this.i - 1 + this.n) % this.n];
    this.next = this.peers[(this.i + 1) % this.n];
    this.bounds = chunkBounds(size, this.n);
    this.acc = null;   // own contribution, then partial sums, then the total
    this.queue = [];   // checked chunks that came before our contribution
    this.seen = 0;     // chunks taken or queued
    this.total = null;
  }

  _send(phase, round, c) {
    const [lo, hi] = this.bounds[c];
    return { T: "ring_chunk", term: this.term, step: this.step, ring: this.ring, phase, round, chunk: c,
      ints: this.acc.slice(lo, hi) };
  }

  /** This replica's contribution (its first `size` entries; the rest are zero by rule). */
  contribute(ints) {
    this.acc = Float64Array.from(ints.subarray ? ints.subarray(0, this.size) : ints.slice(0, this.size));
    const out = [this._send(0, 0, this.i)];
    for (const msg of this.queue) out.push(...this._take(msg));
    this.queue = [];
    return out;
  }

  receive(sender, msg) {
    if (msg.term !== this.term || msg.step !== this.step || msg.ring !== this.ring) {
      throw new RingError(`it is of term ${msg.term}, step ${msg.step}, ring ${msg.ring}; the ring is term ${this.term}, step ${this.step}, ring ${this.ring}`);
    }
    if (sender !== this.prev) throw new RingError(`it comes from ${sender}, not from the ring predecessor ${this.prev}`);
    const last = this.n - 1;
    if (this.seen >= 2 * last) throw new RingError("the ring already has all its chunks");
    const wantPhase = Math.floor(this.seen / last);
    const wantRound = this.seen % last;
    if (msg.phase !== wantPhase || msg.round !== wantRound) {
      throw new RingError(`it is phase ${msg.phase} round ${msg.round}; phase ${wantPhase} round ${wantRound} is due`);
    }
    const want = msg.phase === 0 ? (((this.i - 1 - msg.round) % this.n) + this.n) % this.n
      : (((this.i - msg.round) % this.n) + this.n) % this.n;
    if (msg.chunk !== want) throw new RingError(`it is chunk ${msg.chunk}; this ring position takes chunk ${want}`);
    const [lo, hi] = this.bounds[want];
    if (msg.ints.length !== hi - lo) throw new RingError(`it holds ${msg.ints.length} values; chunk ${want} has ${hi - lo}`);
    const peak = pastBound(msg.ints, this.bound);
    if (peak !== null) throw new RingError(`a value of magnitude ${peak} is over the step's clamp bound ${this.bound}`);
    this.seen += 1;
    if (this.acc === null) {
      this.queue.push(msg);
      return [];
    }
    return this._take(msg);
  }

  _take(msg) {
    const [lo] = this.bounds[msg.chunk];
    const last = msg.round === this.n - 2;
    if (msg.phase === 0) {
      for (let k = 0; k < msg.ints.length; k++) this.acc[lo + k] += msg.ints[k];
      return [last ? this._send(1, 0, msg.chunk) : this._send(0, msg.round + 1, msg.chunk)];
    }
    this.acc.set(msg.ints, lo);
    if (last) {
      if (this.full === this.size) this.total = this.acc;
      else {
        this.total = new Float64Array(this.full);
        this.total.set(this.acc);
      }
      return [];
    }
    return [this._send(1, msg.round + 1, msg.chunk)];
  }
}
