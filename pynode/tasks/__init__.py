"""Tasks: what a run trains. `load_task(name)` resolves a registered name or `module:Class`.

base.py      the Task interface (build_model / sample / loss)
gpt.py       byte-level GPT on the built-in corpus (the default), int8 through the verified units
mlp.py       a small classifier for fast tests
float.py     the same GPT in plain float torch (native only): the plain-float alternative
"""

from __future__ import annotations

import importlib
import inspect
import traceback

from pynode.core.errors import DaisyError
from pynode.extras import require
from pynode.tasks.base import Task

REGISTERED = {
    "gpt": "pynode.tasks.gpt:GPTTask",
    "mlp": "pynode.tasks.mlp:MLPTask",
    "float": "pynode.tasks.float:FloatGPTTask",
}


TASK_MEMBERS = ("name", "build_model", "sample", "loss")  # what base.Task requires


class UnknownTaskError(DaisyError, LookupError):
    """A task name that is neither registered nor an importable module:Class."""


def raised_at(exc: BaseException) -> str:
    """' (file, line N)' of the innermost frame that raised `exc` ('' if none; a
    SyntaxError says its place itself)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) or not frames:
        return ""
    return f" ({frames[-1].filename}, line {frames[-1].lineno})"


def load_task(name: str) -> Task:
    """Instantiate the task called `name` (a registered name or `package.module:Class`);
    MissingExtraError if a module its `requires` names (optional) is not installed."""
    target = REGISTERED.get(name, name)
    if ":" not in target:
        raise UnknownTaskError(
            f"unknown task {name!r}: use one of {', '.join(sorted(REGISTERED))} or module:Class"
        )
    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise UnknownTaskError(f"task {name!r}: give it as module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownTaskError(f"task {name!r}: cannot import {module_name!r} ({exc})") from exc
    except Exception as exc:  # noqa: BLE001 - the module's own error, said where it is
        raise UnknownTaskError(f"task {name!r}: importing {module_name!r} failed: "
                               f"{type(exc).__name__}: {exc}{raised_at(exc)}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise UnknownTaskError(f"task {name!r}: module {module_name!r} has no {class_name!r}")
    if not callable(cls):
        raise UnknownTaskError(f"task {name!r}: {target} is not a class (its type is "
                               f"{type(cls).__name__}; a task is a class with the Task "
                               "interface, made with no arguments: docs/CUSTOM_TASK.md)")
    try:  # a class that needs arguments (its model class, say): named, not a TypeError
        inspect.signature(cls).bind()
    except TypeError as exc:
        raise UnknownTaskError(f"task {name!r}: {target} cannot be made with no arguments "
                               f"({exc})") from None
    except ValueError:  # no signature to read (a builtin): calling it will tell
        pass
    task = cls()
    if not isinstance(task, Task):
        missing = [member for member in TASK_MEMBERS if getattr(task, member, None) is None]
        lacks = f"it has no {', '.join(missing)}" if missing else "see its members"
        raise UnknownTaskError(f"task {name!r}: {target} does not implement the Task interface "
                               f"({lacks}: docs/CUSTOM_TASK.md)")
    require(f"task {name!r}", *getattr(task, "requires", ()))
    return task
