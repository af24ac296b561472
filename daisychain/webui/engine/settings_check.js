// The page's run settings, checked against the same ranges as the commands
// (daisychain/engine/settings.py SETTINGS, the page's subset PAGE_SETTINGS, generated into
// settings_table.js): a whole number
// or a finite decimal number, in the range where the run's arithmetic stays exact. The same
// raw text gets the same reason as in Python (tests/data/settings_values.json holds the
// two together). No DOM here: the settings panel (page/panels/settings.js) shows the reasons
// next to its fields.

import { SETTINGS } from "./settings_table.js";

export { SETTINGS }; // (the table the checks below read)

const INT = /^[+-]?[0-9]{1,30}$/;
const FLOAT = /^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,4})?$/;

export function rangeText(name) {
  const [kind, lo, hi, loOpen] = SETTINGS[name];
  const what = kind === "int" ? "a whole number" : "a finite number";
  return `must be ${what} in ${loOpen ? "(" : "["}${lo}, ${hi}]`;
}

// { value, error }: error is null, or the reason ("must be ... , not 'RAW'").
export function checkSetting(name, raw) {
  const [kind, lo, hi, loOpen] = SETTINGS[name];
  const text = String(raw).trim();
  let v = null;
  if (text.length <= 64 && (kind === "int" ? INT : FLOAT).test(text)) v = Number(text);
  const ok = v !== null && Number.isFinite(v) && (kind !== "int" || Number.isSafeInteger(v)) &&
    (loOpen ? lo < v : lo <= v) && v <= hi;
  return ok ? { value: v, error: null } : { value: v, error: `${rangeText(name)}, not '${raw}'` };
}
