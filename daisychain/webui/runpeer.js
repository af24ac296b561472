// The run protocol lives in run/ (one module per role); this name stays for the shells and
// tests that import it.
export * from "./run/index.js";
