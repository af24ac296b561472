"""Unit tier: the room and approval state machine (``daisychain.server.rooms.Hub``), no I/O."""

from __future__ import annotations

import random

from daisychain import signaling as p
from daisychain.server.config import ServerConfig
from daisychain.server.rooms import CLOSE_POLICY, CLOSE_REPLACED, Hub

from server_helpers import Driver, hello

E = p.ErrorCode


def errors(d: Driver, conn) -> list[str]:
    return [m.code for m in d.take(conn) if isinstance(m, p.Error)]


def test_network_room_groups_by_group_key():
    d = Driver()
    a, ida = d.device(group="local")
    b, idb = d.device(group="local", address="192.168.1.7")
    c, idc = d.device(group="v4:8.8.8.8", address="8.8.8.8")
    st = d.last(a, p.RoomState)
    assert st.room == "network" and st.code is None
    assert [m.id for m in st.members] == [ida, idb]
    assert st.host == ida and st.members[0].host
    assert [m.id for m in d.last(c, p.RoomState).members] == [idc]


def test_private_room_create_join_approve():
    d = Driver()
    h, idh = d.device(room="new", name="host")
    code = d.last(h, p.RoomState).code
    assert p.normalize_room(code) == code and len(code) == 12
    d.take(h)
    j, idj = d.device(room=code.lower().replace("-", ""), name="joiner")
    # the joiner waits: a pending notice, no room state
    assert [type(m) for m in d.take(j)] == [p.Welcome, p.Pending]
    req = d.last(h, p.JoinRequest)
    assert req.peer == p.Device(idj, "joiner", "cpu", 1.0)
    assert [w.id for w in d.last(h, p.RoomState).pending] == [idj]
    d.send(h, p.Approve(peer=idj))
    st = d.last(j, p.RoomState)
    assert [m.id for m in st.members] == [idh, idj] and st.host == idh and st.pending == ()
    assert d.last(h, p.RoomState).pending == ()


def test_pending_device_can_signal_nobody_and_receives_nothing():
    d = Driver()
    h, idh = d.device(room="new")
    code = d.last(h, p.RoomState).code
    m, idm = d.device(room="network")  # not in the room at all
    j, idj = d.device(room=code)
    d.take(h), d.take(j)
    for msg in (p.Offer(sdp="v=0", to=idh), p.Answer(sdp="v=0", to=idh),
                p.Candidate(candidate=None, to=idh), p.Broadcast(data=1), p.Broadcast(data=1, to=idh)):
        d.send(j, msg)
        assert errors(d, j) == [E.NOT_APPROVED.value]
    assert d.take(h) == []
    # members' broadcasts do not reach it either
    d.send(h, p.Broadcast(data="hi"))
    assert d.take(j) == []
    # and it cannot approve itself
    d.send(j, p.Approve(peer=idj))
    assert errors(d, j) == [E.NOT_APPROVED.value]
    assert m  # unrelated device untouched
    assert not any(isinstance(x, p.Broadcast) for x in d.take(m))


def test_deny_gives_an_error_and_removes_the_request():
    d = Driver()
    h, _ = d.device(room="new")
    code = d.last(h, p.RoomState).code
    j, idj = d.device(room=code)
    d.take(j)
    d.send(h, p.Deny(peer=idj))
    assert errors(d, j) == [E.DENIED.value]
    assert d.last(h, p.RoomState).pending == ()
    assert d.hub.peer_info(idj).room is None
    d.send(j, p.Offer(sdp="x", to="whoever"))
    assert errors(d, j) == [E.NOT_IN_ROOM.value]


def test_only_host_approves():
    d = Driver()
    h, _ = d.device(room="new")
    code = d.last(h, p.RoomState).code
    j, idj = d.device(room=code)
    d.send(h, p.Approve(peer=idj))
    k, idk = d.device(room=code)
    d.take(j)
    d.send(j, p.Approve(peer=idk))
    assert errors(d, j) == [E.NOT_HOST.value]
    d.send(h, p.Approve(peer="nobody"))
    assert errors(d, h)[-1] == E.NO_SUCH_PEER.value


def test_relay_stamps_sender_and_stays_in_room():
    d = Driver()
    a, ida = d.device()
    b, idb = d.device()
    x, idx = d.device(room="new")
    d.take(a), d.take(b), d.take(x)
    d.send(a, p.Offer(sdp="v=0 offer", to=idb, sender="forged"))
    assert d.take(b) == [p.Offer(sdp="v=0 offer", sender=ida)]
    d.send(a, p.Offer(sdp="v=0", to=idx))  # another room
    assert errors(d, a) == [E.NO_SUCH_PEER.value] and d.take(x) == []
    d.send(a, p.Offer(sdp="v=0", to=ida))  # itself
    assert errors(d, a) == [E.NO_SUCH_PEER.value]
    d.send(b, p.Broadcast(data={"run": 1}))
    assert d.take(a) == [p.Broadcast(data={"run": 1}, sender=idb)] and d.take(x) == []


def test_host_handover_to_longest_standing():
    d = Driver()
    h, idh = d.device(room="new")
    code = d.last(h, p.RoomState).code
    ids = []
    conns = []
    for _ in range(3):
        c, i = d.device(room=code)
        d.send(h, p.Approve(peer=i))
        conns.append(c), ids.append(i)
    d.send(h, p.Leave())
    for c in conns:
        st = d.last(c, p.RoomState)
        assert st.host == ids[0] and [m.id for m in st.members] == ids
    # the new host now approves
    j, idj = d.device(room=code)
    assert d.last(conns[0], p.JoinRequest).peer.id == idj


def test_reconnect_within_grace_keeps_id_and_approval():
    d = Driver()
    h, idh = d.device(room="new")
    code = d.last(h, p.RoomState).code
    j, idj = d.device(room=code)
    d.send(h, p.Approve(peer=idj))
    token = d.last(j, p.Welcome).token
    d.drop(j)
    assert [m.id for m in d.last(h, p.RoomState).members] == [idh]
    d.tick(5)
    j2 = d.open()
    d.send(j2, hello(room=code, token=token))
    w = d.last(j2, p.Welcome)
    assert w.id == idj and w.resumed and w.token != token
    assert [m.id for m in d.last(j2, p.RoomState).members] == [idh, idj]
    assert d.last(j2, p.Pending) is None


def test_reconnect_after_grace_is_a_new_device():
    d = Driver()
    h, idh = d.device(room="new")
    code = d.last(h, p.RoomState).code
    j, idj = d.device(room=code)
    d.send(h, p.Approve(peer=idj))
    token = d.last(j, p.Welcome).token
    d.drop(j)
    d.tick(11)
    j2 = d.open()
    d.send(j2, hello(room=code, token=token))
    w = d.last(j2, p.Welcome)
    assert w.id != idj and not w.resumed
    assert d.last(j2, p.Pending).code == code and d.last(j2, p.RoomState) is None


def test_host_drop_hands_over_and_comes_back_as_member():
    d = Driver()
    h, idh = d.device(room="new")
    code = d.last(h, p.RoomState).code
    j, idj = d.device(room=code)
    d.send(h, p.Approve(peer=idj))
    token = d.last(h, p.Welcome).token
    d.drop(h)
    assert d.last(j, p.RoomState).host == idj
    h2 = d.open()
    d.send(h2, hello(token=token))
    st = d.last(h2, p.RoomState)
    assert st.host == idj and {m.id for m in st.members} == {idh, idj}


def test_second_connection_with_token_replaces_the_first():
    d = Driver()
    a, ida = d.device()
    token = d.last(a, p.Welcome).token
    a2 = d.open()
    d.send(a2, hello(token=token))
    assert d.closed[a][0] == CLOSE_REPLACED
    assert d.last(a2, p.Welcome).id == ida
    d.drop(a)  # the old socket finally closes: nothing changes
    assert d.hub.peer_info(ida).online


def test_unknown_room_and_limits():
    cfg = ServerConfig(max_room_size=3, max_pending=1, max_rooms_per_address=1)
    d = Driver(hub=Hub(cfg, random.Random(1)))
    c, _ = d.device(room="ABCD-EFGH-JK")
    assert errors(d, c) == [E.NO_SUCH_ROOM.value]
    h, _ = d.device(room="new")
    code = d.last(h, p.RoomState).code
    c2, _ = d.device(room="new")
    assert errors(d, c2) == [E.TOO_MANY_ROOMS.value]
    c3, _ = d.device(room="new", address="10.0.0.9")  # another address may
    assert d.last(c3, p.RoomState).room == "private"
    j1, _ = d.device(room=code)
    j2, _ = d.device(room=code, name="other")  # another device of the address
    assert errors(d, j2) == [E.TOO_MANY_PENDING.value]
    n = [d.device(room="network", address=f"10.0.0.{20 + i}")[0] for i in range(4)]
    assert errors(d, n[-1]) == [E.ROOM_FULL.value]


def test_messages_before_hello_and_second_hello():
    d = Driver()
    c = d.open()
    d.send(c, p.Offer(sdp="x", to="abc"))
    assert errors(d, c) == [E.HELLO_FIRST.value]
    d.send(c, hello())
    d.take(c)
    d.send(c, hello())
    assert errors(d, c) == [E.HELLO_FIRST.value]


def test_bad_frames_get_errors_not_exceptions():
    d = Driver()
    c, _ = d.device()
    d.take(c)
    for frame, code in [("{", E.BAD_JSON), ("[1]", E.BAD_JSON), ('{"type":"nope"}', E.UNKNOWN_TYPE),
                        (b"\x00", E.BAD_MESSAGE), ("x" * 70000, E.TOO_LARGE),
                        ('{"type":"offer","to":"a b","sdp":"x"}', E.BAD_MESSAGE),
                        ("[" * 100000 + "]" * 100000, E.TOO_LARGE),
                        ("[" * 30000 + "]" * 30000, E.BAD_JSON),
                        ('{"type":"ping","t":NaN}', E.BAD_JSON)]:
        d.send(c, frame)
        assert errors(d, c) == [code.value], frame[:30]


def test_flood_closes_with_reason():
    d = Driver(hub=Hub(ServerConfig(rate_per_s=10, burst=5)))
    c, _ = d.device()
    for _ in range(10):
        d.send(c, '{"type":"ping"}')
    assert d.closed[c][0] == CLOSE_POLICY and "flood" in d.closed[c][1]
    assert E.RATE_LIMITED.value in errors(d, c)


def test_hello_timeout_closes_idle_connection():
    d = Driver(hub=Hub(ServerConfig(hello_timeout_s=2)))
    c = d.open()
    d.tick(1)
    assert c not in d.closed
    d.tick(1.5)
    assert "idle" in d.closed[c][1]


def test_last_member_leaving_closes_room_and_tells_waiting_devices():
    d = Driver()
    h, _ = d.device(room="new")
    code = d.last(h, p.RoomState).code
    j, _ = d.device(room=code)
    d.take(j)
    d.send(h, p.Leave())
    assert errors(d, j) == [E.NO_SUCH_ROOM.value]
    assert d.hub.stats()["rooms"] == 0


def test_network_resume_on_another_network_moves_room():
    d = Driver()
    a, ida = d.device(group="v4:1.1.1.1", address="1.1.1.1")
    token = d.last(a, p.Welcome).token
    d.drop(a)
    a2 = d.open(group="v4:2.2.2.2", address="2.2.2.2")
    b, idb = d.device(group="v4:2.2.2.2", address="2.2.2.2")
    d.send(a2, hello(token=token))
    st = d.last(a2, p.RoomState)
    assert {m.id for m in st.members} == {ida, idb}


def test_room_state_rounds_past_the_budget_coalesce_into_the_latest():
    """Each change used to send every member a room state at once; past the room's round
    budget the changes coalesce into one round on the next tick, with the latest state."""
    d = Driver(hub=Hub(ServerConfig(room_updates_per_s=2, room_update_burst=3), random.Random(3)))
    watcher, _ = d.device(name="watcher", address="10.0.0.1")
    d.take(watcher)
    toggler, _ = d.device(name="toggler", address="10.0.0.2")  # round 2 of the burst of 3
    for _ in range(20):
        d.send(toggler, p.Join(room="new"))
        d.send(toggler, p.Join(room="network"))
    states = [m for m in d.take(watcher) if isinstance(m, p.RoomState)]
    assert len(states) == 2  # the burst: join, then the first toggle
    assert d.hub.stats()["coalescing_rooms"] == 1
    d.tick(0.1)  # budget not back yet
    assert not [m for m in d.take(watcher) if isinstance(m, p.RoomState)]
    d.tick(0.5)
    (latest,) = [m for m in d.take(watcher) if isinstance(m, p.RoomState)]
    assert {m.name for m in latest.members} == {"watcher", "toggler"}  # the state as it is now
    assert d.hub.stats()["coalescing_rooms"] == 0


def test_limit_errors_carry_the_limit_and_where_the_client_stands():
    d = Driver(hub=Hub(ServerConfig(codes_per_min=2, deny_cooldown_s=20), random.Random(4)))
    h, _ = d.device(room="new", address="10.0.0.1")
    code = d.last(h, p.RoomState).code
    g, _ = d.device(address="10.0.0.2")
    for _ in range(3):
        d.send(g, p.Join(room="ZZZZ-ZZZZ-ZZ"))
    first, second, third = [m for m in d.take(g) if isinstance(m, p.Error)]
    assert (first.code, first.limit, first.current) == ("no_such_room", 2, 1)
    assert (third.code, third.limit) == ("rate_limited", 2) and third.retry_after_s > 0
    j, jid = d.device(room=code, address="10.0.0.3")
    d.send(h, p.Deny(peer=jid))
    denied = d.last(j, p.Error)
    assert denied.retry_after_s == 20 and "ask again in 20 s" in denied.message
    d.tick(5)
    d.send(j, p.Join(room=code))
    again = d.last(j, p.Error)
    assert again.code == "denied" and 14 < again.retry_after_s <= 15
    d.tick(16)
    d.send(j, p.Join(room=code))
    assert isinstance(d.last(j, p.Pending), p.Pending)
