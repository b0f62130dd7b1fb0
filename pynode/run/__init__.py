"""The run layer: what starts, drives and joins training runs, on every kind of peer.

trainer.py    one step: compute the own microbatches, reduce exactly, apply, agree
crosscheck.py the cross-peer check's plan: sample, digests, who recomputes (decisions)
peercheck.py  a peer's side of it: recompute, compare, arbitrate, leave a wrong peer out
errors.py     the run layer's refusals (fork, contribution, verification, room)
outer.py      --sync-every: one outer step over virtual replicas (H inner steps, one reduce)
loop.py       the one training loop (hooks around each step)
assemble.py   the one place a Trainer is built (verified units, gated GEMM, checkpoints)
protocol.py   the run protocol (go / sync / stop ...) and a room peer's part in it
room.py       a room peer's Run, and the factory and reporter a RoomPeer is given
takeover.py   a room peer's failover messages: report, take over or follow, rewind
failover.py   a room's lost leader: who takes over, from which agreed step (decisions)
steering.py   a room leader's control word before each step: admit, change, pause
group.py      a group's run (loopback or gloo): rank 0's config reaches all, all train
cluster.py    a gloo cluster behind one rank of a room (bridge and followers)
elastic.py    a restarted gloo cluster: the checkpoint its ranks agree to resume from
generate.py   text from a trained GPT: the int8 forward with a KV cache, keyed sampling
kit.py        the one-file HTML inference kit of a checkpoint (JS forward: data/kit.js)

It uses pynode.core (arithmetic) and pynode.comm (transports); neither knows of it.
"""
