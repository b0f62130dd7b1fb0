"""A 2-rank `python -m pynode cluster` between two hosts: network namespaces joined by a veth
pair (tests/netns.py). Rank 0 lives in host a, rank 1 in host b; they can reach each other
only through the veth, so gloo's real sockets cross a host boundary. The per-step hashes
must equal a one-process run of the same config.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from comm_helpers import REPO  # noqa: F401  (puts the repo and tests/ on sys.path)
from netns import private_network

from pynode.config import RunConfig
from pynode.run.assemble import build_trainer

CFG = RunConfig(
    steps=4, seed=1, width=32, layers=1, heads=2, seq=16, microbatch_size=2, microbatches=8
)
FLAGS = ["--steps", "4", "--seed", "1", "--width", "32", "--layers", "1", "--heads", "2",
         "--seq", "16", "--microbatch-size", "2", "--microbatches", "8", "--no-progress"]
PORT = 29511  # fresh namespaces: nothing else can hold it
LIMIT_S = 180


def reference_run() -> tuple[list[str], int]:
    """Per-step hashes of CFG in this process, and the model's parameter count."""
    trainer = build_trainer(CFG)

    async def loop() -> list[str]:
        return [(await trainer.step()).hash for _ in range(CFG.steps)]

    return asyncio.run(loop()), sum(p.size for p in trainer.state.params.values())


def tx_bytes(net, side: str) -> int:
    shown = subprocess.run(
        ["ip", "-n", net.name[side], "-s", "-j", "link", "show", "dev", net.ifname[side]],
        capture_output=True, text=True, check=True, timeout=30,
    )
    return int(json.loads(shown.stdout)[0]["stats64"]["tx"]["bytes"])


def test_gloo_cluster_across_two_hosts_matches_one_process(tmp_path):
    log = tmp_path / "rank0.jsonl"
    with private_network() as net:
        procs = {}
        for rank, side in enumerate(("a", "b")):
            inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")}
            env = {
                **inherited, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1",
                "MASTER_ADDR": net.address["a"], "MASTER_PORT": str(PORT), "WORLD_SIZE": "2",
                "RANK": str(rank), "GLOO_SOCKET_IFNAME": net.ifname[side],
            }
            argv = [sys.executable, "-m", "pynode", "cluster", *FLAGS, "--log", str(log)]
            with open(tmp_path / f"rank{rank}.err", "w") as err:
                procs[rank] = net.popen(side, argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=err, text=True)
        expected, params = reference_run()  # in this process, while the cluster runs
        outputs = {rank: proc.communicate(timeout=LIMIT_S)[0] for rank, proc in procs.items()}
        errors = {r: (tmp_path / f"rank{r}.err").read_text()[-2000:] for r in procs}
        assert [procs[r].returncode for r in (0, 1)] == [0, 0], errors
        sent_by_b = tx_bytes(net, "b")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert [row["hash"] for row in rows] == expected
    assert outputs[0].strip().splitlines()[-1] == expected[-1]
    # Rank 1's int64 gradient partials left host b over the veth, packed by the int64 codec
    # (pynode.comm.wire: ~2.3x fewer than 8 bytes per parameter per step); a quarter is the
    # lower bound, and less than raw int64 shows the packing is what travelled.
    raw = CFG.steps * params * 8
    assert raw // 4 < sent_by_b < raw, (sent_by_b, params)
    assert not net.exists()
