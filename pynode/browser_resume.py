"""The page's "Resume from a checkpoint": how a .pt is read to continue it, and what the page
shows of it before anything starts (a script asks `daisychain.previewResume` for the same).

`preview_checkpoint` and `BrowserPeer.resume` read the file with the same `read_page_resume`
(pynode.run.assemble.read_resume: magic, version, dims, vocab, finiteness, state hash, the
run's end), so the preview refuses exactly the files the resume would; the resume still
checks the file again when its button is pressed (the preview starts nothing and keeps
nothing).
"""

from __future__ import annotations

import json
from typing import Any

from pynode.config import RunConfig
from pynode.core import checkpoint
from pynode.core.errors import DaisyError
from pynode.run.assemble import NothingToTrainError, read_resume

# How the page asks for more steps (the form's field), where `train` names --steps.
MORE_STEPS = "set steps in the form above {step} to continue it"
MODEL_FIELDS = ("width", "layers", "heads", "seq", "sync_every", "replicas")
# What a script passed instead of a .pt's bytes, in its own words.
JS_NAMES = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def buffer_bytes(buffer: Any) -> bytes:
    """The bytes of a JS ArrayBuffer or typed array (a JsProxy under Pyodide) or of bytes
    (tests); TypeError naming what a script passed instead (a string, null, a File)."""
    if isinstance(buffer, (bytes, bytearray, memoryview)):
        return bytes(buffer)
    if hasattr(buffer, "to_bytes") and not isinstance(buffer, int):  # int.to_bytes: 5 -> b"\x05"
        return buffer.to_bytes()
    # named as a script sees it: a JS object by its constructor (File, Object); a JS
    # number, string or null arrives as Python's
    constructor = getattr(getattr(buffer, "constructor", None), "name", None)
    given = (f"a JS {constructor}" if constructor else "null" if buffer is None
             else JS_NAMES.get(type(buffer), type(buffer).__name__))
    raise TypeError(f"a checkpoint is the .pt file's bytes, an ArrayBuffer (await "
                    f"file.arrayBuffer()), got {given}")


def read_page_resume(
    data: bytes, steps: int | None
) -> tuple[RunConfig, checkpoint.CheckpointState]:
    """The checkpoint `data` and the run that continues it: the checkpoint's own, or, where
    the file finished it, the same run to `steps` (the form's), as `train --resume --steps`
    does. Raises what read_resume raises: CheckpointError for a bad file, NothingToTrainError
    where no steps are left."""
    try:
        return read_resume(data, {}, MORE_STEPS)
    except NothingToTrainError:
        if steps is None:
            raise
        return read_resume(data, {"steps": steps}, MORE_STEPS)


def preview_checkpoint(buffer: Any, steps: int | None = None) -> str:
    """What a resume of the .pt `buffer` with the form's `steps` would continue (never raises
    into JS). JSON {ok: true, task, width, layers, heads, seq, sync_every, replicas, lr,
    data, parameters, step (saved at), run_steps (its run's end then), steps (where the
    resume ends; null if it cannot go on), hash, schedule (its changes), refused (why the
    resume would not start, e.g. nothing left to train; null if it would)} or {ok: false,
    error}: a CheckpointError where the file is no valid checkpoint."""
    try:
        data = buffer_bytes(buffer)
        try:
            cfg, ckpt = read_page_resume(data, steps)
            refused = None
        except NothingToTrainError as exc:  # a sound file whose run the form does not extend
            cfg, ckpt = None, checkpoint.load_checkpoint(data)
            refused = f"{type(exc).__name__}: {exc}"
    except (DaisyError, ValueError, TypeError) as exc:
        return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    stored = ckpt.config
    return json.dumps({
        "ok": True, "task": ckpt.task, **{k: stored.get(k) for k in MODEL_FIELDS},
        "lr": stored.get("lr"), "data": stored.get("data"),
        "parameters": sum(int(p.size) for p in ckpt.params.values()),
        "step": ckpt.step, "run_steps": stored.get("steps"),
        "steps": cfg.steps if cfg is not None else None, "hash": ckpt.state_hash,
        "schedule": stored.get("schedule", []), "refused": refused,
    })
