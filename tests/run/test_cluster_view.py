"""The view a cluster's bridge shares before each step (pynode/run/cluster.py): the ranks
behind it plan the step, and with the plan the cross-check's sample, as the bridge does."""

from __future__ import annotations

import asyncio

from pynode.config import RunConfig
from pynode.run.cluster import ClusterBridge, follow_view


class Channel:
    """The bridge collective's share/receive, one message deep."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def share(self, head: dict, blob: bytes, timeout: float) -> None:
        self.sent.append(head)

    async def receive(self, timeout: float) -> tuple[dict, bytes]:
        return self.sent.pop(0), b""


def test_followers_take_the_bridges_capacities_and_distrusted_ranks(checks):
    cfg = RunConfig.from_dict({"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16,
                               "microbatch_size": 2, "microbatches": 8, "steps": 3,
                               "cross_check": 2})
    channel = Channel()
    bridge_trainer, follower = (checks.make_trainer(cfg, None, None) for _ in range(2))
    for trainer in (bridge_trainer, follower):
        trainer.collective = channel
        trainer.members = lambda: (0, 1, 2)  # the room's ranks
    bridge_trainer.capacities = {0: 1.0, 1: 2.0, 2: 5.0}
    bridge_trainer.distrusted = {1}

    bridge = ClusterBridge.__new__(ClusterBridge)
    bridge.pending = None
    asyncio.run(bridge.before_step(bridge_trainer))
    assert channel.sent == [{"t": "view", "capacities": {"0": 1.0, "1": 2.0, "2": 5.0},
                             "distrusted": [1]}]
    asyncio.run(follow_view(follower))
    assert follower.capacities == bridge_trainer.capacities
    assert follower.distrusted == {1}
    assert follower.plan() == bridge_trainer.plan()
    step = follower.state.step + 1
    assert follower.peers.sample(step) == bridge_trainer.peers.sample(step)


def test_the_cluster_publishes_the_union_of_its_ranks_digests():
    from pynode.run.cluster import agreement_entry

    union = agreement_entry([b'{"3": 7}|0', b'{"1": 5, "4": 9}|0', b"{}|0"])
    assert union == b'{"1": 5, "3": 7, "4": 9}|0'
    # ranks that give one microbatch different digests, or a rank missing: nothing readable
    for entries in ([b'{"1": 5}|0', b'{"1": 6}|0'], [b'{"1": 5}|0', None],
                    [b'{"1": 5}|0', b'{"x": 5}|0']):
        entry = agreement_entry(entries)
        assert entry.endswith(b"|0") and not entry.startswith(b"{"), entry
    # the (state hash, probe | speed) votes are published as before
    assert agreement_entry([b"h p|1.5", b"h p|2.0"]) == b"h p|3.5"
    assert agreement_entry([b"h p|1.5", b"g p|2.0"]).startswith(b"cluster ranks disagree")
