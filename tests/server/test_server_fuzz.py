"""Unit tier, property-based: the parser and the room state machine under random input.

Properties: no exception escapes the parser or the hub; a relayed message only ever reaches
an approved member of the sender's own room, stamped with the sender's real id; a device
that waits for approval never receives room state, join requests or relayed messages.
"""

from __future__ import annotations

import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daisychain import signaling as p
from daisychain.server.config import ServerConfig
from daisychain.server.rooms import Close, Hub, Send

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
    st.text(max_size=8), kids, max_size=4), max_leaves=12)
field_names = st.sampled_from(["type", "to", "from", "sdp", "candidate", "data", "peer", "room",
                               "name", "kind", "capacity", "token", "version", "t", "sdpMid"])
type_names = st.sampled_from(sorted(p._CLIENT) + sorted(p._SERVER) + ["", "HELLO", "x"])
objects = st.dictionaries(field_names, json_values | type_names, max_size=8).map(
    lambda d: d) | st.builds(lambda t, d: {**d, "type": t}, type_names,
                             st.dictionaries(field_names, json_values, max_size=8))


@FUZZ
@given(st.text(max_size=300) | st.binary(max_size=50) | objects.map(json.dumps))
def test_parsers_raise_only_protocol_errors(frame):
    for parse in (p.parse_client, p.parse_server):
        try:
            msg = parse(frame)
        except p.ProtocolError as exc:
            assert exc.code in p.ErrorCode and exc.message
        else:
            assert hasattr(msg, "TYPE")
            p.encode(msg)  # whatever parses encodes


ids = st.text("abcdef0123456789", min_size=1, max_size=8)
client_messages = st.one_of(
    st.builds(p.Hello, name=st.text("abc xyz", min_size=1, max_size=10).filter(str.strip),
              kind=st.sampled_from(p.DEVICE_KINDS), capacity=st.floats(0, 100),
              room=st.sampled_from(["network", "new", "K7QM-4XZP-9R"]),
              token=st.none() | st.text("ab", min_size=1, max_size=4)),
    st.builds(p.Offer, sdp=st.text(max_size=30), to=ids),
    st.builds(p.Answer, sdp=st.text(max_size=30), to=ids),
    st.builds(p.Candidate, candidate=st.none() | st.fixed_dictionaries(
        {"candidate": st.text(max_size=20), "sdpMid": st.text(max_size=3),
         "sdpMLineIndex": st.integers(0, 4)}), to=ids),
    st.builds(p.Broadcast, data=json_values, to=st.none() | ids),
    st.builds(p.Approve, peer=ids), st.builds(p.Deny, peer=ids), st.builds(p.Join, room=st.just("new")),
    st.just(p.Leave()), st.builds(p.Ping, t=st.none() | st.floats(-1e6, 1e6)),
)


@FUZZ
@given(client_messages)
def test_client_messages_round_trip(msg):
    back = p.parse_client(p.encode(msg))
    expect = msg if not isinstance(msg, p.Hello) else msg.__class__(
        **{**msg.__dict__, "name": msg.name.strip()})
    assert back == expect


# -- the state machine ------------------------------------------------------------------------

ROOM_PICKS = ("network", "new", "known", "known", "unknown")
op = st.one_of(
    st.tuples(st.just("open"), st.integers(0, 2)),
    st.tuples(st.just("device"), st.integers(0, 2), st.sampled_from(ROOM_PICKS), st.integers(0, 30)),
    st.tuples(st.just("hello"), st.integers(0, 30), st.sampled_from(ROOM_PICKS), st.integers(0, 30),
              st.booleans()),
    st.tuples(st.just("join"), st.integers(0, 30), st.sampled_from(ROOM_PICKS), st.integers(0, 30)),
    st.tuples(st.sampled_from(["offer", "answer", "candidate", "broadcast", "broadcast_all",
                               "approve", "deny"]), st.integers(0, 30), st.integers(0, 30)),
    st.tuples(st.sampled_from(["leave", "drop"]), st.integers(0, 30)),
    st.tuples(st.just("tick"), st.floats(0, 5)),
    st.tuples(st.just("raw"), st.integers(0, 30), st.text(max_size=60) | objects.map(json.dumps)),
)

WAITING_MAY_GET = (p.Welcome, p.Pending, p.Error, p.Pong)


class Model:
    """Runs ops against a Hub and checks every output against the rules."""

    def __init__(self, seed: int):
        cfg = ServerConfig(grace_s=3, hello_timeout_s=4, max_room_size=5, max_pending=2,
                           max_rooms_per_address=3, rate_per_s=1000, burst=1000)
        self.hub = Hub(cfg, random.Random(seed))
        self.now = 0.0
        self.conns: list[int] = []
        self.closed: set[int] = set()
        self.peer_of: dict[int, str] = {}    # conn -> peer id, as told by welcome
        self.tokens: list[str] = []
        self.codes: list[str] = []

    def pick(self, i):
        return self.conns[i % len(self.conns)] if self.conns else None

    def pick_helloed(self, i):
        live = [c for c in self.conns if c in self.peer_of]
        return live[i % len(live)] if live else None

    def peer(self, i):
        known = list(dict.fromkeys(self.peer_of.values()))
        return known[i % len(known)] if known else "nobody"

    def room(self, pick, i):
        if pick == "known":
            return self.codes[i % len(self.codes)] if self.codes else "new"
        return "ZZZZ-ZZZZ-ZZ" if pick == "unknown" else pick

    def run(self, op):
        kind, *a = op
        hub, now = self.hub, self.now
        sender_conn = None
        if kind == "open":
            group = ["local", "v4:8.8.8.8", "v6:2001:db8::/64"][a[0]]
            self.conns.append(hub.open(group, f"addr{a[0]}", now))
            return []
        if kind == "device":  # open + hello in one step
            self.run(("open", a[0]))
            return self.run(("hello", len(self.conns) - 1, a[1], a[2], False))
        if kind == "tick":
            self.now += a[0]
            return self.check(hub.tick(self.now), None)
        c = self.pick(a[0])
        if kind not in ("hello", "raw", "drop"):  # act as a device that said hello
            c = self.pick_helloed(a[0])
        if c is None:
            return []
        sender_conn = c
        if kind == "hello":
            token = self.tokens[a[2] % len(self.tokens)] if a[3] and self.tokens else None
            msg = p.Hello(name="d", kind="cpu", capacity=1, room=self.room(a[1], a[2]), token=token)
        elif kind == "join":
            msg = p.Join(room=self.room(a[1], a[2]))
        elif kind in ("offer", "answer"):
            msg = (p.Offer if kind == "offer" else p.Answer)(sdp="v=0", to=self.peer(a[1]))
        elif kind == "candidate":
            msg = p.Candidate(candidate=None, to=self.peer(a[1]))
        elif kind == "broadcast":
            msg = p.Broadcast(data=[1], to=self.peer(a[1]))
        elif kind == "broadcast_all":
            msg = p.Broadcast(data=[2])
        elif kind == "approve":
            msg = p.Approve(peer=self.peer(a[1]))
        elif kind == "deny":
            msg = p.Deny(peer=self.peer(a[1]))
        elif kind == "leave":
            msg = p.Leave()
        elif kind == "drop":
            self.closed.add(c)
            self.conns.remove(c)
            return self.check(hub.closed(c, now), None)
        else:  # raw
            return self.check(hub.receive(c, a[1], now), sender_conn)
        return self.check(hub.receive_message(c, msg, now), sender_conn)

    def check(self, outputs, sender_conn):
        hub = self.hub
        for o in outputs:
            if isinstance(o, Close):
                continue
            assert isinstance(o, Send)
            assert o.conn not in self.closed, "sent to a closed connection"
            m = o.message
            if isinstance(m, p.Welcome):
                self.peer_of[o.conn] = m.id
                self.tokens.append(m.token)
                continue
            if isinstance(m, p.RoomState) and m.code and m.code not in self.codes:
                self.codes.append(m.code)
            me = hub.peer_info(self.peer_of.get(o.conn, ""))
            if me is not None and me.room is not None and not me.approved:
                assert isinstance(m, WAITING_MAY_GET), f"waiting device got {m}"
            if isinstance(m, (p.RoomState, p.JoinRequest)):
                assert me is not None and me.approved, f"{m.TYPE} to a device not in a room"
                if isinstance(m, p.JoinRequest):
                    assert me.host
            if isinstance(m, p.RELAYED):
                assert sender_conn is not None, "relay out of thin air"
                assert m.sender == self.peer_of[sender_conn], "sender not stamped by server"
                src = hub.peer_info(m.sender)
                assert me is not None and me.approved and src.approved
                assert me.room_key == src.room_key, "message crossed rooms"
                assert me.id != src.id
        return outputs


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.lists(op, max_size=60))
def test_state_machine_keeps_rooms_apart_and_waiting_devices_silent(seed, ops):
    model = Model(seed)
    for o in [("open", 0), ("open", 1)] + ops:
        model.run(o)
    stats = model.hub.stats()
    assert stats["connections"] == len(model.conns)
