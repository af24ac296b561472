// Words and numbers for the page: pure functions, no DOM, no network (UI code only).

import { layersText, LOCAL_FIELDS, RECIPE_FIELDS } from "../engine/spec.js";

/** 1234567 -> "1,234,567" (the same in every locale, so tests and screenshots read alike). */
export function count(n) {
  if (!Number.isFinite(n)) return "—";
  // as toLocaleString("en-US"), which is slow enough to show when called at every step
  const r = Math.round(n);
  const digits = String(Math.abs(r)).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return r < 0 ? `-${digits}` : digits;
}

/** Seconds -> "45 s", "3 min 05 s", "2 h 07 min". */
export function duration(s) {
  if (!Number.isFinite(s) || s < 0) return "—";
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 60) return `${Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(Math.round(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} min`;
}

/** A rate in steps per second, in words that stay readable when it is slow. */
export function stepRate(r) {
  if (!Number.isFinite(r) || r <= 0) return "—";
  return r >= 1 ? `${r.toFixed(1)} steps/s` : `${(60 * r).toFixed(1)} steps/min`;
}

/** "K7QM-4XZP-9R" -> ["K7QM", "4XZP", "9R"]. */
export function codeGroups(code) {
  return String(code || "").split("-").filter(Boolean);
}

/** One shell word: quoted when it holds anything but plain characters. */
export function shellWord(w) {
  const s = String(w);
  return /^[A-Za-z0-9._,:/=+-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`;
}

/**
 * The `daisychain train` command that makes the same run as a page's run identity:
 * `dataArgs` are the /datasets entry's train_args (["--task", "text", "--data", "f.txt"]),
 * else ["--task", identity.task]. `steps` is the step the run reached. The model and recipe
 * flags are checkpoint.py run_flags's: --hidden N or --layers (convs, pools and transformer
 * blocks too, spec.js layersText), --context when a text model reads other than the default
 * 8 characters, and the image recipe's flags whenever set, always for an image run (its
 * defaults are not 0 and depend on --steps).
 */
export function trainCommand(identity, dataArgs, steps) {
  const hp = identity.hyper || {};
  const layers = layersText(identity.model || { layers: [] });
  const args = [...(dataArgs && dataArgs.length ? dataArgs : ["--task", identity.task])];
  args.push("--steps", String(steps), "--seed", String(hp.seed ?? identity.seed ?? 0),
    "--batch", String(hp.batch), "--micro-batch", String(hp.micro_batch), "--lr", String(hp.lr));
  if (hp.weight_decay) args.push("--weight-decay", String(hp.weight_decay));
  if (/^[0-9]+$/.test(layers)) args.push("--hidden", layers);
  else if (layers) args.push("--layers", layers);
  const input = identity.model?.input;
  if (input?.kind === "tokens" && input.dim !== 8) args.push("--context", String(input.dim)); // 8: the default
  for (const k of RECIPE_FIELDS) {
    if (hp[k] || identity.task === "image") args.push(`--${k.replace(/_/g, "-")}`, String(hp[k] ?? 0));
  }
  for (const k of LOCAL_FIELDS) if (k in hp) args.push(`--${k.replace(/_/g, "-")}`, String(hp[k])); // local steps
  return ["daisychain", "train", ...args].map(shellWord).join(" ");
}

/** Replace every known device id in `text` by its name (ids are hex strings of 6+ chars). */
export function namesForIds(text, names) {
  let out = String(text ?? "");
  for (const [id, name] of Object.entries(names || {})) {
    if (id && id.length >= 6 && name && out.includes(id)) out = out.split(id).join(name);
  }
  return out;
}

/** A loss with its significant digits: 2.3026, 0.0412, 0.000123, 3.45e-7 (never "0.0000"). */
export function loss(x) {
  if (!Number.isFinite(x)) return "—";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 0.01) return x.toFixed(4);
  if (a >= 1e-5) return String(Number(x.toPrecision(3)));
  return x.toExponential(2);
}

/** An accuracy in [0, 1] -> "93.10%". */
export function percent(x) {
  return Number.isFinite(x) ? `${(x * 100).toFixed(2)}%` : "—";
}

/** A device's measured speed, in words a newcomer reads: "812.5 micro-batches/s (16 samples each)". */
export function rate(capacity, microBatch = 16) {
  return Number.isFinite(capacity) ? `${capacity.toFixed(1)} micro-batches/s (${microBatch} samples each)` : "—";
}

/** A local-steps run's capacity: a replica's rounds per second (run_speed.js taskRate). */
export function roundRate(capacity, syncEvery) {
  return Number.isFinite(capacity) ? `${capacity.toFixed(2)} replica rounds/s (${syncEvery} inner steps each)` : "—";
}

/** A compute-path reason in a newcomer's words (the engine's own words name the API calls). */
export function plainReason(text) {
  return String(text ?? "")
    .replace(/WebGPU is present but requestAdapter\(\) returned null: no usable GPU adapter \(([^)]*)\)/g,
      "no WebGPU here: the browser found no graphics chip it may use ($1)")
    .replace(/this browser has no WebGPU \(navigator\.gpu is missing\)/g, "this browser has no WebGPU")
    .replace(/WebGPU requestAdapter\(\) failed: /g, "the browser could not open the graphics chip for WebGPU: ")
    .replace(/WebGPU requestDevice\(\) failed: /g, "the graphics chip refused WebGPU: ");
}

/** A local-steps run's line (engine/local.js): "round 3 · 4 replicas × 8 inner steps (inner
 *  step 24) · this device computed replicas 0, 2 of round 2". */
export function localSteps(loc, round) {
  const mine = loc.mine ? `this device computed replica${loc.mine.micro.length === 1 ? "" : "s"} ` +
    `${loc.mine.micro.join(", ")} of round ${loc.mine.step}` : "this device has computed no replica yet";
  return `round ${round} · ${loc.replicas} replicas × ${loc.syncEvery} inner steps (inner step ${loc.inner}) · ${mine}`;
}

/** A class's name: the data's label names where it has them (meta.labels), else its number. */
export function className(ds, k) {
  const names = ds.meta && Array.isArray(ds.meta.labels) ? ds.meta.labels : null;
  const name = names && typeof names[k] === "string" && names[k] ? names[k].slice(0, 24) : null;
  return name ?? String(k);
}
