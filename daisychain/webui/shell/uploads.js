// The room credential for the server's upload and data routes (daisychain/server/uploads.py):
// this device's signaling session token (welcome.token), sent in the X-Daisy-Token header,
// never in a URL. network.js sets it on every welcome; uploads and data fetches add it.

export const CREDENTIAL_HEADER = "X-Daisy-Token";

let credential = null;

/** The token of the last welcome (null: not connected yet). */
export function setCredential(token) {
  credential = typeof token === "string" && token ? token : null;
}

/** `headers` plus the credential, when there is one. */
export function withCredential(headers = {}) {
  return credential ? { ...headers, [CREDENTIAL_HEADER]: credential } : { ...headers };
}

/** POST `body` to `url` with the credential. A refusal's `{"error": reason}` body comes back
 *  as a Response whose text is the reason (the one line the page shows). */
export async function postUpload(url, body, headers = {}) {
  const resp = await fetch(url, { method: "POST", body, headers: withCredential(headers) });
  if (resp.ok) return resp;
  const text = await resp.text();
  let why = text;
  try {
    const parsed = JSON.parse(text);
    if (parsed && typeof parsed.error === "string") why = parsed.error;
  } catch { /* a plain-text refusal */ }
  return new Response(why, { status: resp.status, statusText: resp.statusText });
}
