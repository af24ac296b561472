// A first load that meets a network failure (a dropped Wi-Fi, ERR_NETWORK_CHANGED) says so
// and tries again, instead of waiting forever: `retrying` runs an async step again after a
// failed fetch (or a step that never answers), with a growing pause, saying each time what
// failed and when it tries again. Any other error is the step's own and is thrown at once.

/** A fetch that failed on the way (not an answer of the server's): TypeError "Failed to
 *  fetch", a network error named in the message, a 5xx, or a step that timed out. */
export function isNetworkError(err) {
  return err instanceof TypeError || err?.name === "TimeoutError" ||
    /Failed to fetch|NetworkError|network|ERR_[A-Z_]+|HTTP 5\d\d|Load failed|timed out/i.test(String(err?.message));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** `fn()`; after a network failure `say(text)` and again after 1, 2, 4 ... 30 s, up to `tries`
 *  attempts. A step that has not answered after `timeoutMs` counts as failed (its late
 *  answer is dropped). */
export async function retrying(fn, { what, say, tries = 20, firstMs = 1000, mostMs = 30000, timeoutMs = 0 }) {
  for (let k = 1; ; k++) {
    try {
      if (!timeoutMs) return await fn();
      let timer;
      const late = new Promise((_, reject) => {
        timer = setTimeout(() => reject(Object.assign(new Error(`no answer in ${Math.round(timeoutMs / 1000)} s (timed out)`),
          { name: "TimeoutError" })), timeoutMs);
      });
      try {
        return await Promise.race([fn(), late]);
      } finally {
        clearTimeout(timer);
      }
    } catch (err) {
      if (!isNetworkError(err) || k >= tries) throw err;
      const wait = Math.min(mostMs, firstMs * 2 ** (k - 1));
      say(`${what} failed: ${err.message} — the network may have dropped. Trying again in ${Math.max(1, Math.round(wait / 1000))} s (try ${k + 1} of ${tries})…`);
      await sleep(wait);
    }
  }
}
