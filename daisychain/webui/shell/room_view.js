// What the room looks like to this tab: the room:peers event's detail (bus.js), one row
// per member of the room, then the devices that did work in this run and left.

import { capacityOf } from "./run_speed.js";

/** The room:peers detail of `mesh` (mesh.js). */
export function peersView(mesh) {
  const p = mesh.peer;
  const members = mesh.net.room?.members || [];
  const tr = p?.trainer;
  const nMicro = tr ? tr.nTasks : null; // micro-batches; a local-steps run's replicas
  // members, then those who did work in this run and left (left: true)
  const gone = Object.keys(p?.doneBy || {}).filter((id) => !members.some((m) => m.id === id))
    .map((id) => ({ ...(mesh.seen.get(id) || { id, name: mesh.nameOf(id), kind: "?" }), capacity: 0, left: true }));
  const rows = [...members, ...gone].map((m) => {
    let hashAgrees = null;
    if (m.id === p?.me) hashAgrees = p?.sha ? true : null;
    else {
      const r = mesh.reports.get(m.id);
      const ours = r && r.runId === p?.runId ? mesh.shaAt.get(r.step) : undefined;
      if (ours !== undefined && typeof r.sha === "string") hashAgrees = r.sha === ours;
    }
    const { capacity, onModel, inTasks } = capacityOf(p, m, mesh.runCapacity);
    return { id: m.id, name: m.name, kind: m.kind, capacity, onModel, inTasks, probe: m.capacity,
      share: nMicro ? (mesh.lastShares[m.id] || 0) / nMicro : 0, micro: p?.doneBy[m.id] || 0,
      hashAgrees, you: m.id === p?.me, host: m.id === mesh.net.room?.host, left: !!m.left };
  });
  const rate = mesh.stepRate();
  const step = p?.step ?? 0;
  const steps = p?.run ? (p.coordinating ? p.steps : p.run.steps) : null;
  const left = steps === null ? null : Math.max(0, steps - step);
  // a local-steps run (engine/local.js): the round, the inner steps, this device's replicas
  const local = tr?.replicas !== undefined ? { replicas: tr.replicas, syncEvery: tr.syncEvery, inner: tr.inner,
    mine: mesh.lastMine ?? null } : null;
  return { rows, pooledCapacity: rows.filter((r) => !r.left).reduce((s, r) => s + (Number(r.capacity) || 0), 0),
    pooledOnModel: rows.some((r) => r.onModel),
    stepRate: rate, etaSeconds: rate && left !== null ? left / rate : null, step, steps, local };
}
