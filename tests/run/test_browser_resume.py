"""pynode.browser_resume: the page's preview of a .pt refuses what its resume refuses and
says what the resume would continue (the page's Chromium side: e2e/test_page_resume.py)."""

from __future__ import annotations

import asyncio
import io
import json
import zipfile

import pytest

from pynode.browser_resume import preview_checkpoint, read_page_resume
from pynode.config import RunConfig
from pynode.core.checkpoint import CheckpointError
from pynode.run.assemble import NothingToTrainError
from pynode.run.schedule import Change

CONFIG = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
          "microbatches": 2, "steps": 2, "lr": 0.003, "seed": 5}


@pytest.fixture(scope="module")
def finished(checks) -> bytes:
    """A 2-step run's checkpoint, its learning rate changed after step 1."""
    trainer = checks.make_trainer(RunConfig.from_dict(CONFIG), None, None)

    async def train():
        await trainer.step()
        trainer.apply_change(Change(step=1, lr=0.001))
        await trainer.step()

    asyncio.run(train())
    return trainer.state_bytes()


def test_the_preview_says_what_the_resume_continues(finished):
    cfg, ckpt = read_page_resume(finished, 5)
    shown = json.loads(preview_checkpoint(finished, 5))
    assert shown == {
        "ok": True, "task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16,
        "sync_every": None, "replicas": None, "lr": 0.001, "data": "builtin",
        "parameters": shown["parameters"], "step": 2, "run_steps": 2, "steps": cfg.steps,
        "hash": ckpt.state_hash, "schedule": [{"step": 1, "lr": 0.001}], "refused": None}
    assert cfg.steps == 5 and shown["parameters"] == sum(p.size for p in ckpt.params.values())


def test_a_finished_run_without_more_steps_is_shown_with_the_resumes_refusal(finished):
    with pytest.raises(NothingToTrainError) as refused:
        read_page_resume(finished, 2)
    shown = json.loads(preview_checkpoint(finished, 2))
    assert (shown["ok"], shown["step"], shown["steps"]) == (True, 2, None), shown
    assert shown["refused"] == f"NothingToTrainError: {refused.value}", shown
    assert "set steps in the form above 2 to continue it" in shown["refused"]


def zip_of_text() -> bytes:
    """A sound zip archive that holds no checkpoint."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("notes.txt", "not a model")
    return out.getvalue()


@pytest.mark.parametrize("spoil", [
    lambda data: b"not a checkpoint",
    lambda data: data[: len(data) // 2],
    lambda data: zip_of_text(),
])
def test_a_file_the_resume_refuses_is_refused_by_the_preview_in_its_words(finished, spoil):
    bad = spoil(finished)
    assert bad != finished
    with pytest.raises(CheckpointError) as refused:
        read_page_resume(bad, 5)
    shown = json.loads(preview_checkpoint(bad, 5))
    assert shown == {"ok": False, "error": f"CheckpointError: {refused.value}"}, shown


@pytest.mark.parametrize(("given", "named"), [
    (None, "null"), ("run.pt", "a string"), (5, "a number"), (True, "a boolean"),
])
def test_what_is_no_buffer_is_refused_by_name(given, named):
    """A script's previewResume or resume of a string, null or a number: 5 read as the one
    byte 5 (int.to_bytes), the others as Python's words for bytes()."""
    shown = json.loads(preview_checkpoint(given, 5))
    assert shown == {"ok": False, "error": "TypeError: a checkpoint is the .pt file's bytes, an "
                     f"ArrayBuffer (await file.arrayBuffer()), got {named}"}, shown
