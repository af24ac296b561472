"""The data-channel wire format, in one import: every byte a peer sends another over WebRTC
is framed, parsed and validated by the three modules re-exported here, and nowhere else.
``daisychain/webui/wire/frames.js`` is the one JS mirror (the same cases hold both:
tests/scenarios/frames.json) and ``docs/MESH.md`` documents each field.

- :mod:`daisychain.peer.framing`: a message (type, run id, step, meta, body) <-> frames of
  at most :data:`MAX_FRAME` bytes, the header layout, the meta JSON (NaN / Infinity refused)
  and the per-channel :class:`Reassembler`;
- :mod:`daisychain.peer.intcodec`: the integer-vector codecs of CONTRIB / TOTAL bodies
  (:func:`encode_ints` sends NARROW or VARINT, whichever is smaller) and the STATE body;
- :mod:`daisychain.peer.messages`: the typed run messages and :func:`to_message` /
  :func:`from_message`, every meta field checked.
"""

from daisychain.peer.framing import (  # noqa: F401
    HEADER, HEADER_SIZE, MAGIC, MAX_CHUNK, MAX_FRAME, MAX_MESSAGE, MAX_META, VERSION, WHOLE, Codec,
    Frame, FrameError, FrameType, Message, Reassembler, _run_bytes, decode_frame, encode_frames,
    parse_meta)
from daisychain.peer.intcodec import (  # noqa: F401
    INT_LIMIT, decode_ints, decode_state, encode_ints, encode_state, varint_decode, varint_encode)
from daisychain.peer.messages import (  # noqa: F401
    CONTROLS, MAX_CAPACITY, MAX_RING, MAX_STRIKES, MIN_CAPACITY, Assign, Contrib, Data, DataRequest,
    End, Ready, Refuse, Restore, RingChunk, RingCommit, RingPlan, RingSum, Run, RunMessage, State,
    SyncRequest, Task, Total, from_message, to_message)
