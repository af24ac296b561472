// The data-channel wire format in one import, JS mirror of daisychain/peer/frames.py
// (docs/MESH.md documents every field; tests/scenarios/frames.json holds both languages to
// the same cases). Encode/decode only: no DOM, no RTCPeerConnection.
//   framing.js   a message <-> frames, the header, meta JSON, the Reassembler
//   intcodec.js  integer-vector codecs of CONTRIB / TOTAL bodies
//   messages.js  the typed run messages: encode(msg) and fromMessage(m)

export * from "./framing.js";
export * from "./intcodec.js";
export * from "./messages.js";
