"""The room rules without sockets: fake links record exactly what each peer was sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from server.protocol import ProtocolError
from server.rooms import PEER_ID_ALPHABET, RoomLimits, Rooms
from server.tokens import TokenSigner

KEY = b"k" * 32


class FakeLink:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.closed: tuple[int, str] | None = None

    def deliver(self, frame: str) -> None:
        self.frames.append(json.loads(frame))

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def take(self) -> list[dict[str, Any]]:
        frames, self.frames = self.frames, []
        return frames

    def types(self) -> list[str]:
        return [f["type"] for f in self.take()]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_rooms(**limits: Any) -> tuple[Rooms, Clock]:
    clock = Clock()
    return Rooms(TokenSigner(KEY, 3600), RoomLimits(**limits), clock=clock), clock


def offer(to: str) -> dict[str, Any]:
    return {"v": 1, "type": "offer", "to": to, "sdp": "v=0"}


def private_room() -> tuple[Rooms, str, str, FakeLink, str, FakeLink]:
    rooms, _ = make_rooms()
    host = FakeLink()
    host_id = rooms.create(host, "10.0.0.1")
    code = host.frames[0]["room"]
    guest = FakeLink()
    guest_id = rooms.join(guest, "10.0.0.9", code, None)
    return rooms, code, host_id, host, guest_id, guest


def test_auto_room_groups_by_address_and_approves_everyone() -> None:
    rooms, _ = make_rooms()
    a, b, c = FakeLink(), FakeLink(), FakeLink()
    a_id = rooms.join(a, "198.51.100.7", None, None)
    b_id = rooms.join(b, "198.51.100.7", None, None)
    rooms.join(c, "203.0.113.1", None, None)
    joined = b.frames[0]
    assert joined["state"] == "approved" and joined["role"] == "member" and joined["room"] is None
    roster = a.frames[-1]
    assert [p["id"] for p in roster["peers"]] == [a_id, b_id]
    assert roster["host"] == a_id
    assert all(b_id not in json.dumps(f) for f in c.frames)
    rooms.handle(a_id, a, offer(b_id))
    assert b.frames[-1] == {"v": 1, "type": "offer", "from": a_id, "sdp": "v=0"}
    rooms.leave(a_id, a)
    assert b.frames[-1]["host"] == b_id  # the longest-connected member takes over


def test_pending_guest_sees_only_its_own_state_and_can_send_nothing() -> None:
    rooms, code, host_id, host, guest_id, guest = private_room()
    assert guest.types() == ["joined"]
    assert host.frames[-1]["peers"][1] == {"id": guest_id, "role": "member", "state": "pending"}
    for msg in (offer(host_id), {"v": 1, "type": "status", "step": 1},
                {"v": 1, "type": "approve", "peer": guest_id}):
        with pytest.raises(ProtocolError) as info:
            rooms.handle(guest_id, guest, msg)
        assert info.value.code == "pending"
    with pytest.raises(ProtocolError) as info:
        rooms.handle(host_id, host, offer(guest_id))
    assert info.value.code == "no_peer"
    rooms.handle(host_id, host, {"v": 1, "type": "status", "step": 3})
    assert guest.frames == []


def test_approval_then_removal_cuts_the_guest_off() -> None:
    rooms, code, host_id, host, guest_id, guest = private_room()
    guest.take()
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": guest_id})
    assert guest.types() == ["approved", "roster"]
    rooms.handle(guest_id, guest, offer(host_id))
    assert host.frames[-1]["from"] == guest_id
    rooms.handle(host_id, host, {"v": 1, "type": "remove", "peer": guest_id})
    assert guest.types() == ["removed"] and guest.closed == (4403, "removed")
    with pytest.raises(ProtocolError):
        rooms.handle(guest_id, guest, offer(host_id))
    assert guest_id not in json.dumps(host.frames[-1]["peers"])
    # the roster says why it went (the others' pages read "left the room" before)
    assert host.frames[-1]["removed"] == [guest_id]
    rooms.join(FakeLink(), "10.0.0.3", code, None)
    assert "removed" not in host.frames[-1], "only the roster right after a removal says so"
    # Its token no longer brings it back.
    token = rooms._signer.issue(code, guest_id, False)
    again = FakeLink()
    rooms.join(again, "10.0.0.9", code, token)
    assert again.types() == ["removed"] and again.closed is not None


def test_only_the_host_approves_and_denies() -> None:
    rooms, code, host_id, host, guest_id, guest = private_room()
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": guest_id})
    other = FakeLink()
    other_id = rooms.join(other, "10.0.0.10", code, None)
    with pytest.raises(ProtocolError) as info:
        rooms.handle(guest_id, guest, {"v": 1, "type": "approve", "peer": other_id})
    assert info.value.code == "forbidden"
    rooms.handle(host_id, host, {"v": 1, "type": "deny", "peer": other_id})
    assert [f["type"] for f in other.frames] == ["joined", "denied"]
    assert other.closed is not None
    with pytest.raises(ProtocolError) as info:
        rooms.handle(host_id, host, {"v": 1, "type": "remove", "peer": host_id})
    assert info.value.code == "no_peer"


def test_unknown_code_answers_like_a_real_room() -> None:
    rooms, code, host_id, host, guest_id, guest = private_room()
    stranger = FakeLink()
    rooms.join(stranger, "10.0.0.11", "B" * 22, None)
    real, fake = guest.frames[0], stranger.frames[0]
    assert real.keys() == fake.keys()
    for key in ("type", "private", "role", "state"):
        assert real[key] == fake[key]
    assert len(stranger.frames) == len(guest.frames) == 1
    rooms.leave(fake["peer"], stranger)
    assert rooms.counts()["rooms"] == 1  # the unclaimed room is gone with its last peer


def test_a_code_in_capitals_reaches_its_room_and_a_mixed_case_one_stays_its_own() -> None:
    """Codes are made lowercase; the link with its code in capitals (read out, retyped)
    waited for an approval no host was asked for. A code token_urlsafe made before is
    mixed-case and stays exactly its own room (SERVER.md)."""
    rooms, code, host_id, host, guest_id, guest = private_room()
    host.take()
    shouting = FakeLink()
    shouting_id = rooms.join(shouting, "10.0.0.12", code.upper(), None)
    assert shouting.frames[0]["room"] == code and shouting.frames[0]["state"] == "pending"
    listed = [p["id"] for p in host.frames[-1]["peers"]]
    assert shouting_id in listed and guest_id in listed, host.frames[-1]
    old = "Ab" * 11  # a mixed-case code (an older room's, or a made-up one)
    first, second, lower = FakeLink(), FakeLink(), FakeLink()
    rooms.join(first, "10.0.0.13", old, None)
    rooms.join(second, "10.0.0.14", old, None)
    rooms.join(lower, "10.0.0.15", old.lower(), None)
    assert first.frames[0]["room"] == second.frames[0]["room"] == old
    assert lower.frames[0]["room"] == old.lower()


def test_host_token_reclaims_a_room_after_restart() -> None:
    rooms, code, host_id, host, guest_id, guest = private_room()
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": guest_id})
    host_token, guest_token = host.take()[0]["token"], guest.take()[0]["token"]
    fresh, _ = make_rooms()  # a restarted server: same key, no state
    new_guest, new_host = FakeLink(), FakeLink()
    assert fresh.join(new_guest, "10.0.0.9", code, guest_token) == guest_id
    assert new_guest.frames[0]["state"] == "pending"
    assert fresh.join(new_host, "10.0.0.8", code, host_token) == host_id
    assert new_host.frames[0]["role"] == "host" and new_host.frames[0]["state"] == "approved"
    entry = new_host.frames[-1]["peers"][0]
    assert entry == {"id": guest_id, "role": "member", "state": "pending", "resumed": True}


def test_peer_ids_have_no_look_alike_characters() -> None:
    """A host compares the id a newcomer reads out with its table's: ids never hold the
    characters people confuse (l and 1, O and 0, I), and stay unique and 14 long."""
    rooms, _ = make_rooms()
    ids = [rooms.create(FakeLink(), f"10.0.{i // 200}.{i % 200}") for i in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 14 and set(i) <= set(PEER_ID_ALPHABET) for i in ids)
    assert not set("".join(ids)) & set("ilouILOU_-")
    assert set("".join(ids)) == set(PEER_ID_ALPHABET)  # every character in use


def test_room_codes_have_no_look_alike_characters_and_keep_their_form() -> None:
    """A code may be read over the phone: the same alphabet as peer ids, 22 long (the form
    CODE_PATTERN and every client take), never a leading "-"."""
    from server.protocol import CODE_PATTERN

    rooms, _ = make_rooms()
    codes = []
    for i in range(500):
        host = FakeLink()
        rooms.create(host, f"10.1.{i // 200}.{i % 200}")
        codes.append(host.frames[0]["room"])
    assert len(set(codes)) == len(codes)
    assert all(CODE_PATTERN.fullmatch(c) and set(c) <= set(PEER_ID_ALPHABET) for c in codes)


def test_a_reloaded_host_page_hosts_again_under_a_new_id() -> None:
    """A host's page that reloads (its state new: `fresh`) gets the host role back under a
    new peer id, and can approve again; before, its token was lost with the page and the
    room had nobody to approve anyone."""
    rooms, code, host_id, host, guest_id, guest = private_room()
    token = host.take()[0]["token"]
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": guest_id})
    rooms.leave(host_id, host)  # the tab reloads: its socket goes first
    page = FakeLink()
    new_id = rooms.join(page, "10.0.0.1", code, token, fresh=True)
    joined = page.frames[0]
    assert new_id != host_id and (joined["peer"], joined["role"], joined["state"]) == \
        (new_id, "host", "approved")
    roster = guest.frames[-1]
    assert roster["host"] == new_id and [p["id"] for p in roster["peers"]] == [guest_id, new_id]
    stranger = FakeLink()
    stranger_id = rooms.join(stranger, "10.0.0.7", code, None)
    assert stranger.frames[0]["state"] == "pending"
    rooms.handle(new_id, page, {"v": 1, "type": "approve", "peer": stranger_id})
    assert [f["type"] for f in stranger.frames][:2] == ["joined", "approved"]
    # the old id's token no longer names the host: a plain join, pending
    late = FakeLink()
    assert rooms.join(late, "10.0.0.1", code, token, fresh=True) not in (host_id, new_id)
    assert late.frames[0]["state"] == "pending"


def test_a_replaced_host_token_brings_back_neither_id_nor_role(tmp_path) -> None:
    """After a reload the old id's token (a duplicated tab still holds it) is a plain join:
    not the old id approved (it kept its approval and came back without the host), nor,
    after a restart, the host role (it took the room from the host's current token)."""
    from server.revocations import Revocations

    path = tmp_path / "revoked.txt"
    rooms = Rooms(TokenSigner(KEY, 3600), revocations=Revocations(path, 3600))
    host = FakeLink()
    old_id = rooms.create(host, "10.0.0.1")
    code, old_token = host.frames[0]["room"], host.frames[0]["token"]
    rooms.leave(old_id, host)
    page = FakeLink()
    new_id = rooms.join(page, "10.0.0.1", code, old_token, fresh=True)
    new_token = page.frames[0]["token"]
    stale = FakeLink()
    assert rooms.join(stale, "10.0.0.1", code, old_token) not in (old_id, new_id)
    assert (stale.frames[0]["role"], stale.frames[0]["state"]) == ("member", "pending")
    restarted = Rooms(TokenSigner(KEY, 3600), revocations=Revocations(path, 3600))
    first = FakeLink()
    assert restarted.join(first, "10.0.0.1", code, old_token) != old_id
    assert (first.frames[0]["role"], first.frames[0]["state"]) == ("member", "pending")
    back = FakeLink()
    assert restarted.join(back, "10.0.0.1", code, new_token) == new_id
    assert (back.frames[0]["role"], back.frames[0]["state"]) == ("host", "approved")


@pytest.mark.parametrize("fresh", [False, True])
def test_a_room_full_of_waiting_joins_takes_its_host_back(fresh: bool) -> None:
    """After a restart (or while the host's page reloads) anyone with the code could fill
    the room with pending joins, and the host's token was refused with room_full."""
    rooms, _ = make_rooms(max_room_peers=3, max_pending_per_address=3)
    host = FakeLink()
    host_id = rooms.create(host, "10.0.0.1")
    code, token = host.frames[0]["room"], host.frames[0]["token"]
    rooms.leave(host_id, host)
    crowd = [FakeLink() for _ in range(3)]
    for link in crowd:
        rooms.join(link, "10.0.0.66", code, None)
    with pytest.raises(ProtocolError, match="free place"):
        rooms.join(FakeLink(), "10.0.0.67", code, None)
    back = FakeLink()
    rooms.join(back, "10.0.0.1", code, token, fresh=fresh)
    assert (back.frames[0]["role"], back.frames[0]["state"]) == ("host", "approved")


def test_a_host_page_open_twice_keeps_one_host() -> None:
    """A duplicated host tab (the same token) takes the role; the first page is told it was
    replaced and stops reconnecting (4409)."""
    rooms, code, host_id, host, _, _ = private_room()
    token = host.frames[0]["token"]
    twin = FakeLink()
    new_id = rooms.join(twin, "10.0.0.1", code, token, fresh=True)
    assert twin.frames[0]["role"] == "host" and new_id != host_id
    assert host.closed == (4409, "replaced")
    assert [f["code"] for f in host.frames if f["type"] == "error"] == ["replaced"]
    with pytest.raises(ProtocolError):
        rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": new_id})


def test_a_reloaded_member_page_asks_again_as_a_new_peer() -> None:
    """`fresh` with a member's token: the page is a new peer, pending (its old id's links
    and part in a run are not its own any more)."""
    rooms, code, host_id, host, guest_id, guest = private_room()
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": guest_id})
    token = guest.frames[0]["token"]
    rooms.leave(guest_id, guest)
    page = FakeLink()
    new_id = rooms.join(page, "10.0.0.9", code, token, fresh=True)
    assert new_id != guest_id and page.frames[0]["state"] == "pending"


def test_member_reconnect_keeps_approval_and_replaces_the_old_socket() -> None:
    rooms, code, host_id, host, guest_id, guest = private_room()
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": guest_id})
    token = guest.frames[0]["token"]
    second = FakeLink()
    assert rooms.join(second, "10.0.0.9", code, token) == guest_id
    assert second.frames[0]["state"] == "approved"
    assert guest.closed is not None and guest.frames[-1]["code"] == "replaced"
    rooms.leave(guest_id, guest)  # the old socket's late goodbye changes nothing
    rooms.handle(host_id, host, offer(guest_id))
    assert second.frames[-1]["type"] == "offer"


def test_a_token_of_another_room_or_a_forged_one_is_ignored() -> None:
    rooms, code, host_id, host, guest_id, guest = private_room()
    other_signer = TokenSigner(b"x" * 32, 3600)
    forged = other_signer.issue(code, host_id, True)
    link = FakeLink()
    assert rooms.join(link, "10.0.0.12", code, forged) != host_id
    assert link.frames[0]["state"] == "pending"
    auto_token = TokenSigner(KEY, 3600).issue("auto:whatever", "peerX", True)
    link2 = FakeLink()
    assert rooms.join(link2, "10.0.0.12", code, auto_token) != "peerX"


def test_limits_and_idle_rooms() -> None:
    rooms, clock = make_rooms(max_rooms=2, max_room_peers=2, room_idle_s=60)
    host = FakeLink()
    host_id = rooms.create(host, "10.0.0.1")
    code = host.take()[0]["room"]
    guest = FakeLink()
    guest_id = rooms.join(guest, "10.0.0.1", code, None)
    with pytest.raises(ProtocolError) as info:
        rooms.join(FakeLink(), "10.0.0.2", code, None)
    assert info.value.code == "room_full"
    rooms.create(FakeLink(), "10.0.0.1")
    with pytest.raises(ProtocolError) as info:
        rooms.create(FakeLink(), "10.0.0.1")
    assert info.value.code == "server_full"
    rooms.leave(guest_id, guest)
    rooms.leave(host_id, host)
    clock.now += 30
    with pytest.raises(ProtocolError):
        rooms.create(FakeLink(), "10.0.0.1")  # the host's room waits for its host a while
    clock.now += 31
    rooms.create(FakeLink(), "10.0.0.1")  # ...but not forever


def test_removed_and_denied_ids_stay_out_after_a_restart(tmp_path) -> None:
    from server.revocations import Revocations

    path = tmp_path / "revoked.txt"
    rooms = Rooms(TokenSigner(KEY, 3600), revocations=Revocations(path, 3600))
    host = FakeLink()
    host_id = rooms.create(host, "10.0.0.1")
    code = host.take()[0]["room"]
    removed, denied = FakeLink(), FakeLink()
    removed_id = rooms.join(removed, "10.0.0.2", code, None)
    denied_id = rooms.join(denied, "10.0.0.3", code, None)
    tokens = {removed_id: removed.frames[0]["token"], denied_id: denied.frames[0]["token"]}
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": removed_id})
    rooms.handle(host_id, host, {"v": 1, "type": "remove", "peer": removed_id})
    rooms.handle(host_id, host, {"v": 1, "type": "deny", "peer": denied_id})
    # A restarted server: same key, a fresh registry, the revocations read back from disk.
    fresh = Rooms(TokenSigner(KEY, 3600), revocations=Revocations(path, 3600))
    for peer_id, token in tokens.items():
        link = FakeLink()
        assert fresh.join(link, "10.0.0.4", code, token) == peer_id
        assert link.types() == ["removed"] and link.closed == (4403, "removed")
    assert fresh.counts() == {"rooms": 0, "peers": 0}
    kept = FakeLink()  # a token nobody revoked still resumes (pending, for the host)
    fresh.join(kept, "10.0.0.5", code, rooms._signer.issue(code, "someoneElse", False))
    assert kept.frames[0]["peer"] == "someoneElse" and kept.frames[0]["state"] == "pending"


def test_one_address_cannot_take_more_than_its_room_quota() -> None:
    rooms, clock = make_rooms(max_rooms_per_address=3, max_rooms=100, room_idle_s=60)
    links = [FakeLink() for _ in range(3)]
    made = [rooms.create(link, "198.51.100.7") for link in links]
    with pytest.raises(ProtocolError) as info:
        rooms.create(FakeLink(), "198.51.100.7")
    assert info.value.code == "too_many_rooms"
    rooms.create(FakeLink(), "203.0.113.9")  # another address still can
    assert rooms.counts()["rooms"] == 4
    # Once one of its rooms is gone (empty, then idle), the address may make another.
    rooms.leave(made[0], links[0])
    clock.now += 61
    rooms.create(FakeLink(), "198.51.100.7")
    with pytest.raises(ProtocolError):
        rooms.create(FakeLink(), "198.51.100.7")


def test_pending_joins_per_address_are_capped_the_same_for_unknown_and_real_codes() -> None:
    rooms, _ = make_rooms(max_pending_per_address=2, max_rooms=1)
    host = FakeLink()
    rooms.create(host, "10.0.0.1")
    real = host.take()[0]["room"]
    for code in (real, "C" * 22):
        for _ in range(2):
            rooms.join(FakeLink(), "198.51.100.7", code, None)
        with pytest.raises(ProtocolError) as info:
            rooms.join(FakeLink(), "198.51.100.7", code, None)
        assert info.value.code == "too_many_pending"
        rooms.join(FakeLink(), "203.0.113.9", code, None)  # another address still can
    # max_rooms is 1 and spent, yet the unknown code answered like the real one, and
    # /healthz's room count did not move for it.
    assert rooms.counts() == {"rooms": 1, "peers": 7}


def test_a_room_remembers_a_bounded_number_of_approvals() -> None:
    rooms, _ = make_rooms(max_approved_ids=4, max_room_peers=64)
    host = FakeLink()
    host_id = rooms.create(host, "10.0.0.1")
    code = host.take()[0]["room"]
    ids = []
    for i in range(10):  # each joins, is approved, and leaves again
        link = FakeLink()
        peer_id = rooms.join(link, f"10.0.1.{i}", code, None)
        rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": peer_id})
        rooms.leave(peer_id, link)
        ids.append(peer_id)
    remembered = list(rooms._rooms[code].approved_ids)
    assert len(remembered) == 4 and host_id in remembered  # the connected host stays
    assert remembered[1:] == ids[-3:]  # the most recent absent ones are kept


def test_the_log_says_who_came_and_went_without_a_joinable_code(caplog) -> None:
    """An operator watching `python -m server` saw nothing of its rooms: a friend waiting
    for approval in a room whose host had left, a removal, a departure. Each is one INFO
    line now, naming the room by four characters of its code (the log is no share link)."""
    caplog.set_level("INFO", logger="server.rooms")
    rooms, clock = make_rooms(room_idle_s=60)
    host = FakeLink()
    host_id = rooms.create(host, "10.0.0.1")
    code = host.frames[0]["room"]
    guest, late = FakeLink(), FakeLink()
    guest_id = rooms.join(guest, "10.0.0.9", code, None)
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": guest_id})
    rooms.handle(host_id, host, {"v": 1, "type": "remove", "peer": guest_id})
    rooms.leave(host_id, host)
    late_id = rooms.join(late, "10.0.0.7", code, None)
    rooms.leave(late_id, late)
    clock.now += 61
    rooms.create(FakeLink(), "10.0.0.2")  # forgets the idle room first
    label = f"room {code[:4]}…"
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:8] == [
        f"{label} created by peer {host_id} from 10.0.0.1",
        f"{label}: peer {host_id} joined from 10.0.0.1 as its host (1 connected)",
        f"{label}: peer {guest_id} from 10.0.0.9 waits for the host's approval",
        f"{label}: the host approved peer {guest_id}",
        f"{label}: the host removed peer {guest_id}",
        f"{label}: peer {host_id} left (0 connected)",
        f"{label}: peer {late_id} from 10.0.0.7 waits for the host's approval (no host is "
        "connected: nobody can approve it now)",
        f"{label}: peer {late_id} left (0 connected)",
    ]
    assert lines[8] == f"{label} closed: empty for 61 s"
    assert all(code not in line for line in lines)
    caplog.clear()
    auto_id = rooms.join(FakeLink(), "198.51.100.7", None, None)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("automatic room ")
    assert line.endswith(f"…: peer {auto_id} joined from 198.51.100.7 as its host (1 connected)")


def test_a_removed_peer_turned_away_again_is_in_the_log(caplog) -> None:
    caplog.set_level("INFO", logger="server.rooms")
    rooms, code, host_id, host, guest_id, guest = private_room()
    token = guest.frames[0]["token"]
    rooms.handle(host_id, host, {"v": 1, "type": "approve", "peer": guest_id})
    rooms.handle(host_id, host, {"v": 1, "type": "remove", "peer": guest_id})
    caplog.clear()
    rooms.join(FakeLink(), "10.0.0.9", code, token)
    assert [r.getMessage() for r in caplog.records] == [
        f"room {code[:4]}…: peer {guest_id}, which the host removed or declined, was turned "
        "away again"]


def test_joins_to_made_up_codes_cannot_flood_the_log(caplog) -> None:
    """A script joining made-up codes wrote two INFO lines a try (waits, left) for as long
    as it ran. Each address group has a budget of lines; the next line written says how
    many were left out, and other groups keep theirs."""
    from server.rooms import GROUP_LINES_BURST, GROUP_LINES_PER_S

    caplog.set_level("INFO", logger="server.rooms")
    rooms, clock = make_rooms()
    for i in range(GROUP_LINES_BURST):  # 2 lines a try: half the tries fill the budget
        link = FakeLink()
        rooms.leave(rooms.join(link, "203.0.113.0/24", f"made-up-code-{i:09d}", None), link)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == GROUP_LINES_BURST, lines
    friend = rooms.join(FakeLink(), "10.0.0.9", "another-code-000000000", None)
    assert [r.getMessage() for r in caplog.records][-1].endswith(
        f"peer {friend} from 10.0.0.9 waits for the host's approval (a code this server does "
        "not know: mistyped, or a room from before a restart whose host has not come back)")
    clock.now += 1 / GROUP_LINES_PER_S
    late = rooms.join(FakeLink(), "203.0.113.0/24", "made-up-code-late00000", None)
    assert [r.getMessage() for r in caplog.records][-1].endswith(
        f"peer {late} from 203.0.113.0/24 waits for the host's approval (a code this server "
        "does not know: mistyped, or a room from before a restart whose host has not come "
        f"back) (and {GROUP_LINES_BURST} such lines from 203.0.113.0/24 left out before this "
        "one)")
