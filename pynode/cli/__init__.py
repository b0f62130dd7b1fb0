"""The command line: the only place that reads argv and prints results (the library logs).

main.py     the parser and `python -m pynode {train,generate,kit,cluster,join,verify,bench}`
flags.py    flags the commands share and the checks made on them
report.py   progress bar, step log, summaries, --save (`Saver`), `say`
faults.py   PYNODE_FAULT, the fault injection of the fault tests
train.py    `train`: one peer (or `--peers N`, see group.py)
group.py    `train --peers N` (loopback processes) and `cluster` (gloo)
elastic.py  `cluster --elastic`: torchrun's elastic agent, and a rank it may restart
generate.py `generate`: a prompt continued by a checkpoint's model, streamed
kit.py      `kit`: a one-file HTML inference kit of a checkpoint (pynode/data/kit.js)
join.py     `join`: a native peer in a room (with --cluster, a gloo cluster behind it)
peer.py     NativePeer: signaling, the aiortc mesh and the run protocol glued together
"""
