"""Rooms and who may see what: the signaling state machine, free of sockets.

A room is either *auto* (everyone behind one public address; all members approved, the
longest-connected member is its host) or *private* (a server-made code; its creator is the
host and approves every join). Only approved members receive or send relayed frames,
rosters and status; a pending peer hears about nothing but its own state. Peers are reached
through a ``PeerLink`` whose ``deliver`` never blocks, so one registry lock guards it all.

Enumeration: joining an unknown code answers exactly as joining a real room whose host has
not decided yet (``joined`` with ``state: pending``); the unknown code becomes a room without
a host, which only a host resume token for that code can claim (after a server restart).
Such an unclaimed room counts nowhere (not in ``max_rooms``, not in ``counts()``), so no
reply and no number tells an unknown code from a real one.

Quotas per client address (``RoomLimits``): private rooms it created that still exist, and
its pending joins in one room. Revoked ids (removed or denied by a host) live in
``Revocations``, which persists them across restarts.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.ice import IceIssuer
from server.protocol import HOST_TYPES, RELAY_TYPES, ProtocolError, encode
from server.ratelimit import LinesPerKey
from server.revocations import Revocations
from server.tokens import ResumeClaim, TokenSigner

log = logging.getLogger(__name__)
# Peer ids and room codes are read out and compared by eye (a waiting page names its id,
# the host's table and the logs name every peer; a code may be read over the phone), so no
# two of their characters look alike: digits and lower-case letters without i, l, o and u
# (Crockford's base 32, 5 random bits each). An id is 14 of them (70 bits); a code 22
# (110 bits), the length server/protocol.py's CODE_PATTERN has always taken (codes made
# by token_urlsafe before stay valid), never starting with "-" (`join --room -abc` would
# read it as a flag).
PEER_ID_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
PEER_ID_LENGTH = 14
ROOM_CODE_LENGTH = 22


def unambiguous(length: int) -> str:
    """`length` random characters of PEER_ID_ALPHABET."""
    return "".join(secrets.choice(PEER_ID_ALPHABET) for _ in range(length))
# The log's lines on what peers from one address group did (joined, waits, left, refused,
# turned away): thirty at once, then one every 2 s, so that a script joining made-up codes
# cannot fill the log. A room's host and its approvals are not limited.
GROUP_LINES_BURST = 30
GROUP_LINES_PER_S = 0.5


class PeerLink(Protocol):
    def deliver(self, frame: str) -> None: ...  # queue a frame; never blocks

    def close(self, code: int, reason: str) -> None: ...  # flush, then close the socket


@dataclass
class Member:
    id: str
    link: PeerLink
    approved: bool
    group: str = ""  # the client address group it joined from
    resumed: bool = False  # came back with a token its room could not vouch for
    status: dict[str, Any] | None = None  # the last status frame's fields


def room_label(key: str, private: bool) -> str:
    """A room in the server's log: enough of its code to tell rooms apart, not enough to
    join one (a log is read by more people than the room's link)."""
    return f"room {key[:4]}…" if private else \
        f"automatic room {key.removeprefix('auto:')[:4]}…"


@dataclass
class Room:
    key: str  # code of a private room, "auto:<digest>" of an auto room
    private: bool
    host_id: str | None = None  # a private room keeps its host id while the host is away
    members: dict[str, Member] = field(default_factory=dict)  # connected, in join order
    # May resume without re-approval; insertion-ordered, the oldest absent ones pruned.
    approved_ids: dict[str, None] = field(default_factory=dict)
    empty_since: float | None = None
    creator: str | None = None  # address group that created this private room

    @property
    def claimed(self) -> bool:
        """An auto room, or a private room with a host (not merely an unknown code)."""
        return not self.private or self.host_id is not None

    @property
    def code(self) -> str | None:
        return self.key if self.private else None

    @property
    def label(self) -> str:
        return room_label(self.key, self.private)


@dataclass(frozen=True)
class RoomLimits:
    max_rooms: int = 10000  # rooms held at once
    max_room_peers: int = 64  # connected peers per room (and the host, coming back)
    room_idle_s: float = 120.0  # an empty room is forgotten after this
    max_rooms_per_address: int = 16  # existing private rooms one address created
    max_pending_per_address: int = 16  # pending joins of one address in one room
    max_approved_ids: int = 256  # remembered approvals per room (absent ones pruned first)


class Rooms:
    """The registry of rooms; every public method is atomic under one lock."""

    def __init__(
        self,
        signer: TokenSigner,
        limits: RoomLimits = RoomLimits(),
        clock: Callable[[], float] = time.monotonic,
        revocations: Revocations | None = None,
        ice: IceIssuer | None = None,
    ) -> None:
        self._signer = signer
        self._ice = ice if ice is not None and ice.configured else None
        self._limits = limits
        self._clock = clock
        self._revoked = revocations if revocations is not None else Revocations(None, 1e18)
        self._lock = threading.Lock()
        self._rooms: dict[str, Room] = {}
        self._room_of: dict[str, str] = {}  # connected peer id -> room key
        self._created: Counter[str] = Counter()  # address group -> its existing private rooms
        self._group_lines = LinesPerKey(GROUP_LINES_PER_S, GROUP_LINES_BURST, clock=clock)

    def note(self, group: str, message: str, *args: object) -> None:
        """An INFO line on what a peer from address `group` did, within the group's budget
        of lines; the next line written says how many were left out."""
        left_out = self._group_lines.admit(group)
        if left_out:
            log.info(message + " (and %d such lines from %s left out before this one)",
                     *args, left_out, group)
        elif left_out is not None:
            log.info(message, *args)

    # ----------------------------------------------------------------- entering
    def join(
        self, link: PeerLink, address_group: str, code: str | None, token: str | None,
        fresh: bool = False,
    ) -> str:
        """Enter the auto room of ``address_group``, or the private room ``code``. `fresh`:
        the page that holds `token` reloaded, so nothing of its old self lives on (its
        links, its part in a run): a host's token gives the host role to a new peer id, and
        any other token is not used (the page asks again, as a new peer)."""
        claim = self._signer.verify(token) if token else None
        with self._lock:
            key = (self._private_key(code) if code is not None
                   else self._signer.room_key_for_address(address_group))
            if claim is not None and claim.room != key:
                claim = None
            if code is not None and claim is not None and self._revoked.is_revoked(key, claim.peer):
                if not claim.host:
                    self.note(address_group, "%s: peer %s, which the host removed or "
                              "declined, was turned away again", room_label(key, True),
                              claim.peer)
                    link.deliver(encode("removed", reason="removed by the host"))
                    link.close(4403, "removed")
                    return claim.peer
                claim = None  # a host id a reload replaced (_reclaim_host): a plain join
            # An unknown code must cost nothing that a real one does not: no room quota.
            room = self._room(key, private=code is not None, counted=code is None)
            try:
                if code is None:
                    return self._enter_auto(room, link, address_group,
                                            None if fresh else claim)
                if fresh and claim is not None:
                    if self._hosts(room, claim):
                        return self._reclaim_host(room, link, address_group, claim.peer)
                    claim = None
                return self._enter_private(room, link, address_group, claim)
            except ProtocolError:
                if not room.members and not room.approved_ids:
                    self._forget(room)  # refused into a room made for it: leave no trace
                raise

    def _private_key(self, code: str) -> str:
        """The room `code` names: its own, or where no room has it, the room of the code in
        lower case. Codes are made lowercase (PEER_ID_ALPHABET), and one read out or retyped
        comes back in capitals at times (such a link waited for an approval no host was
        asked for); codes token_urlsafe made before are mixed-case, and taken as given."""
        if code in self._rooms or code.lower() not in self._rooms:
            return code
        return code.lower()

    def create(self, link: PeerLink, address_group: str) -> str:
        """Make a private room with a fresh code; the caller is its approved host."""
        with self._lock:
            self._forget_idle()  # rooms it no longer holds do not count
            if self._created[address_group] >= self._limits.max_rooms_per_address:
                raise ProtocolError("too_many_rooms",
                                    "your address already holds its quota of rooms")
            code = unambiguous(ROOM_CODE_LENGTH)
            while code in self._rooms:
                code = unambiguous(ROOM_CODE_LENGTH)
            room = self._room(code, private=True, counted=True)
            room.creator = address_group
            self._created[address_group] += 1
            peer_id = self._new_id()
            room.host_id = peer_id
            log.info("%s created by peer %s from %s", room.label, peer_id, address_group)
            self._admit(room, Member(peer_id, link, approved=True, group=address_group))
            return peer_id

    def _enter_auto(
        self, room: Room, link: PeerLink, group: str, claim: ResumeClaim | None
    ) -> str:
        peer_id = claim.peer if claim is not None else self._new_id()
        self._check_capacity(room, peer_id)
        if room.host_id not in room.members or room.host_id == peer_id:
            room.host_id = peer_id
        self._admit(room, Member(peer_id, link, approved=True, group=group))
        return peer_id

    def _enter_private(
        self, room: Room, link: PeerLink, group: str, claim: ResumeClaim | None
    ) -> str:
        peer_id = claim.peer if claim is not None else self._new_id()
        if self._hosts(room, claim):  # no capacity check: waiting joins cannot lock it out
            room.host_id = peer_id
        else:
            self._check_capacity(room, peer_id)
        approved = peer_id == room.host_id or peer_id in room.approved_ids
        if not approved:
            pending = sum(1 for m in room.members.values()
                          if not m.approved and m.group == group and m.id != peer_id)
            if pending >= self._limits.max_pending_per_address:
                raise ProtocolError("too_many_pending",
                                    "your address already has its quota of waiting joins")
        resumed = claim is not None and not approved
        member = Member(peer_id, link, approved=approved, group=group, resumed=resumed)
        self._admit(room, member)
        return peer_id

    @staticmethod
    def _hosts(room: Room, claim: ResumeClaim | None) -> bool:
        """Whether `claim` is the host's own: a host token of the room's host, or of a room
        that has none (a restarted server's)."""
        return claim is not None and claim.host and room.host_id in (None, claim.peer)

    def _reclaim_host(self, room: Room, link: PeerLink, group: str, old_id: str) -> str:
        """The host's page reloaded: the host role moves to a new peer id. The old id's
        socket, if it is still open (a duplicated tab), is replaced; its WebRTC links and
        its part in a run end as a closed tab's do. The old id is revoked (kept on disk), so
        its token, wherever it still is, brings back neither the id nor the role, restarts
        included."""
        old = room.members.get(old_id)
        if old is not None:
            self._replace(old, "the host's page reloaded in another tab")
            self._drop(room, old_id)
        peer_id = self._new_id()  # no capacity check: as a returning host's (_enter_private)
        room.host_id = peer_id
        log.info("%s: the host's page reloaded; its host is now peer %s", room.label, peer_id)
        self._admit(room, Member(peer_id, link, approved=True, group=group))
        # after the new id is in: the room must not look empty of approvals meanwhile
        room.approved_ids.pop(old_id, None)
        self._revoked.revoke(room.key, old_id)
        return peer_id

    @staticmethod
    def _replace(old: Member, why: str) -> None:
        """Close `old`'s socket: another took its place (4409: the page stops, no retry)."""
        old.link.deliver(encode("error", code="replaced", message=why))
        old.link.close(4409, "replaced")

    def _ice_fields(self, member: Member) -> dict[str, Any]:
        """``rtcConfig`` (ICE servers, TURN credentials) for an approved member only."""
        if self._ice is None or not member.approved:
            return {}
        return {"rtcConfig": self._ice.rtc_config(member.id)}

    def _check_capacity(self, room: Room, peer_id: str) -> None:
        if peer_id not in room.members and len(room.members) >= self._limits.max_room_peers:
            raise ProtocolError("room_full", "the room has no free place")

    def _admit(self, room: Room, member: Member) -> None:
        old = room.members.pop(member.id, None)
        if old is not None:  # the same peer reconnected: its old socket goes
            self._replace(old, "signed in elsewhere")
        room.members[member.id] = member
        room.empty_since = None
        if member.approved:
            self._remember_approval(room, member.id)
        self._room_of[member.id] = room.key
        role = "host" if member.id == room.host_id else "member"
        if member.approved:
            self.note(member.group, "%s: peer %s joined from %s as its %s (%d connected)",
                      room.label, member.id, member.group, role, len(room.members))
        else:
            why = "" if room.host_id in room.members else \
                " (no host is connected: nobody can approve it now)" if room.claimed else \
                " (a code this server does not know: mistyped, or a room from before a " \
                "restart whose host has not come back)"
            self.note(member.group, "%s: peer %s from %s waits for the host's approval%s",
                      room.label, member.id, member.group, why)
        member.link.deliver(encode(
            "joined", peer=member.id, room=room.code, private=room.private, role=role,
            state="approved" if member.approved else "pending",
            token=self._signer.issue(room.key, member.id, role == "host"),
            **self._ice_fields(member),
        ))
        self._send_rosters(room)

    # ----------------------------------------------------------------- in the room
    def handle(self, peer_id: str, link: PeerLink, msg: dict[str, Any]) -> None:
        """Act on a validated frame of a joined peer (not join/create/ping/leave)."""
        with self._lock:
            room, member = self._lookup(peer_id, link)
            kind = msg["type"]
            if not member.approved:
                raise ProtocolError("pending", "wait for the host's approval")
            if kind in HOST_TYPES:
                self._host_action(room, member, kind, msg["peer"])
            elif kind in RELAY_TYPES:
                self._relay(room, member, msg)
            elif kind == "status":
                self._status(room, member, msg)
            else:
                raise ProtocolError("unknown_type", f"{kind} is not a room action")

    def leave(self, peer_id: str, link: PeerLink) -> None:
        """The peer's socket is gone or it said leave; a no-op if it was replaced meanwhile."""
        with self._lock:
            key = self._room_of.get(peer_id)
            room = self._rooms.get(key) if key is not None else None
            if room is None or peer_id not in room.members:
                return
            if room.members[peer_id].link is not link:
                return
            group = room.members[peer_id].group
            self._drop(room, peer_id)
            self.note(group, "%s: peer %s left (%d connected)", room.label, peer_id,
                      len(room.members))
            self._send_rosters(room)

    def _lookup(self, peer_id: str, link: PeerLink) -> tuple[Room, Member]:
        key = self._room_of.get(peer_id)
        room = self._rooms.get(key) if key is not None else None
        member = room.members.get(peer_id) if room is not None else None
        if room is None or member is None or member.link is not link:
            raise ProtocolError("not_joined", "join a room first")
        return room, member

    def _host_action(self, room: Room, host: Member, kind: str, target_id: str) -> None:
        if not room.private:
            raise ProtocolError("not_private", "an auto room has no approvals")
        if host.id != room.host_id:
            raise ProtocolError("forbidden", f"only the host may {kind}")
        target = room.members.get(target_id)
        if target is None or target.id == host.id or (kind != "remove") == target.approved:
            raise ProtocolError("no_peer", f"no peer {target_id} to {kind}")
        log.info("%s: the host %s peer %s", room.label,
                 {"approve": "approved", "deny": "declined", "remove": "removed"}[kind], target.id)
        if kind == "approve":
            target.approved = True
            self._remember_approval(room, target.id)
            target.link.deliver(encode("approved", peer=target.id, **self._ice_fields(target)))
        elif kind == "deny":
            self._revoked.revoke(room.key, target.id)  # its token never brings it back
            target.link.deliver(encode("denied", reason="the host declined"))
            target.link.close(4403, "denied")
            self._drop(room, target.id)
        else:
            self._revoked.revoke(room.key, target.id)
            room.approved_ids.pop(target.id, None)
            target.link.deliver(encode("removed", reason="removed by the host"))
            target.link.close(4403, "removed")
            self._drop(room, target.id)
            self._send_rosters(room, removed=target.id)
            return
        self._send_rosters(room)

    def _relay(self, room: Room, sender: Member, msg: dict[str, Any]) -> None:
        target = room.members.get(msg["to"])
        if target is None or not target.approved or target.id == sender.id:
            raise ProtocolError("no_peer", "no approved peer with that id in this room")
        fields = {k: v for k, v in msg.items() if k not in ("v", "type", "to")}
        target.link.deliver(encode(msg["type"], **{"from": sender.id}, **fields))

    def _status(self, room: Room, sender: Member, msg: dict[str, Any]) -> None:
        sender.status = {k: v for k, v in msg.items() if k not in ("v", "type")}
        frame = encode("status", **{"from": sender.id}, **sender.status)
        for other in room.members.values():
            if other.approved and other.id != sender.id:
                other.link.deliver(frame)

    # ----------------------------------------------------------------- bookkeeping
    def _drop(self, room: Room, peer_id: str) -> None:
        del room.members[peer_id]
        self._room_of.pop(peer_id, None)
        if not room.private and room.host_id == peer_id:
            approved = [m.id for m in room.members.values() if m.approved]
            room.host_id = approved[0] if approved else None
        if not room.members:
            room.empty_since = self._clock()
            if not room.approved_ids:  # nobody could resume into it: no reason to keep it
                self._forget(room)

    def _remember_approval(self, room: Room, peer_id: str) -> None:
        room.approved_ids.pop(peer_id, None)
        room.approved_ids[peer_id] = None
        if len(room.approved_ids) > self._limits.max_approved_ids:
            absent = [i for i in room.approved_ids if i not in room.members]
            for stale in absent[: len(room.approved_ids) - self._limits.max_approved_ids]:
                del room.approved_ids[stale]

    def _forget(self, room: Room) -> None:
        if self._rooms.get(room.key) is not room:
            return
        del self._rooms[room.key]
        if room.creator is not None:
            self._created[room.creator] -= 1
            if self._created[room.creator] <= 0:
                del self._created[room.creator]

    def _send_rosters(self, room: Room, removed: str | None = None) -> None:
        """Each approved member's roster; `removed`: the peer the host just removed, so
        the others say why its links close (it did not leave)."""
        approved = [self._entry(room, m) for m in room.members.values() if m.approved]
        everyone = [self._entry(room, m) for m in room.members.values()]
        extra = {"removed": [removed]} if removed is not None else {}
        for member in room.members.values():
            if member.approved:
                peers = everyone if member.id == room.host_id else approved
                member.link.deliver(encode("roster", room=room.code, host=room.host_id,
                                           peers=peers, **extra))

    @staticmethod
    def _entry(room: Room, member: Member) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": member.id,
            "role": "host" if member.id == room.host_id else "member",
            "state": "approved" if member.approved else "pending",
        }
        if member.resumed:
            entry["resumed"] = True
        if member.status is not None:
            entry["status"] = member.status
        return entry

    def _room(self, key: str, private: bool, counted: bool) -> Room:
        room = self._rooms.get(key)
        if room is not None:
            return room
        self._forget_idle()
        if counted and self._claimed_rooms() >= self._limits.max_rooms:
            raise ProtocolError("server_full", "the server holds too many rooms; try later")
        room = self._rooms[key] = Room(key=key, private=private, empty_since=self._clock())
        return room

    def _claimed_rooms(self) -> int:
        return sum(1 for r in self._rooms.values() if r.claimed)

    def _forget_idle(self) -> None:
        now = self._clock()
        idle = [r for r in self._rooms.values()
                if r.empty_since is not None and r.empty_since <= now - self._limits.room_idle_s]
        for room in idle:  # swept at the next join or create, so say how long it was empty
            if room.claimed:
                log.info("%s closed: empty for %.0f s", room.label, now - room.empty_since)
            self._forget(room)

    def _new_id(self) -> str:
        while True:
            peer_id = unambiguous(PEER_ID_LENGTH)
            if peer_id not in self._room_of:
                return peer_id

    # ----------------------------------------------------------------- introspection
    def counts(self) -> dict[str, int]:
        """Rooms and connected peers, for /healthz and the benchmark (no identities)."""
        with self._lock:
            return {"rooms": self._claimed_rooms(), "peers": len(self._room_of)}
