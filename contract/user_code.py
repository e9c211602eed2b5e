"""User code named in a config: reward functions (`rewards.funcs = ["my_rewards.py:score"]` or
`["my_pkg.rewards:score"]`) and environment classes (`env.environment = "my_env.py:Wordle"`).

A file path is resolved against the working directory (absolute paths work as is) and loaded as
a module of its own; `module:name` is imported with importlib. Every failure is one
UserError line naming the config key, the entry and what is allowed.

`guarded` is the one way the engine calls into such code once loaded (a reward function, an environment's
constructor, reset, tools, step, get_reward): on a daemon thread, under a time bound, with everything it raises,
SystemExit and KeyboardInterrupt included, caught and explained inside that bound. The process-wide state such code
can change and the trainer relies on (KEPT) is put back once the call returns or its bound passes.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError, describe, user_path


class CallTimeout(BaseException):
    """Raised inside user code's thread when it outlives its bound. A BaseException, so `except Exception` in user
    code does not swallow it."""


@dataclass
class Guarded:
    """What one guarded call came to: its value, or what it raised (explained), or that it ran past its bound."""

    value: object = None
    error: BaseException | None = None
    explained: object = None  # explain(error), computed inside the bound (an exception's __str__ is user code too)
    timed_out: bool = False


class _QuietTimeouts:
    """sys.unraisablehook, less the CallTimeouts that land where Python cannot raise them (a __del__ stopped at
    its bound): those are the guard's own, already reported as the call's timeout."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, unraisable):
        if not isinstance(unraisable.exc_value, CallTimeout):
            self.hook(unraisable)


STDIO = ("stdin", "stdout", "stderr")


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except Exception:  # noqa: BLE001 - a stream without a descriptor (a test's capture)
        return None


def _stdio() -> list:
    return [(name, getattr(sys, name), _fileno(getattr(sys, name))) for name in STDIO]


def _put_stdio(saved: list) -> None:
    """The trainer's standard streams back in sys; one the user's code closed is reopened on its descriptor."""
    for name, stream, fd in saved:
        if getattr(stream, "closed", False) and fd is not None:
            line = getattr(stream, "line_buffering", False)
            try:
                stream = open(  # noqa: SIM115 - it replaces sys.stdout and lives as long
                    fd,
                    "r" if name == "stdin" else "w",
                    1 if line else -1,
                    stream.encoding,
                    stream.errors,
                    closefd=False,
                )
            except OSError:  # its descriptor was closed with it (a stream that owned it): nothing to reopen
                pass
        setattr(sys, name, stream)


# (read, put back): the process-wide state that code can change from a guarded call and the trainer relies on.
# The engine adds torch's default dtype (contract/ never imports torch). Signal handlers need no entry: only the
# main thread may set them, so signal.signal() in a guarded call raises ValueError.
KEPT: list[tuple[Callable[[], object], Callable[[object], None]]] = [
    (sys.getrecursionlimit, sys.setrecursionlimit),
    (os.getcwd, os.chdir),
    (_stdio, _put_stdio),
]


def _put_back(saved: list) -> None:
    for put, value in saved:
        try:
            put(value)
        except Exception:  # noqa: BLE001 - a deleted working directory, a limit below the current depth
            pass


def _read_kept() -> list:
    saved = []
    for read, put in KEPT:
        try:
            saved.append((put, read()))
        except Exception:  # noqa: BLE001 - a working directory already deleted: nothing to go back to
            pass
    return saved


ABANDONED: list[threading.Thread] = []  # the threads of calls past their bound that did not stop when asked


def still_running(name: str) -> int:
    """How many guarded calls named `name` still run past their bound: each one's thread spins on (it caught the
    timeout, or sits in C code) and takes its share of the interpreter from every later step."""
    ABANDONED[:] = [thread for thread in ABANDONED if thread.is_alive()]
    return sum(thread.name == name for thread in ABANDONED)


def guarded(
    fn: Callable[[], object], timeout_s: float, explain: Callable[[BaseException], object], name: str = "user-code"
) -> Guarded:
    """fn() on a daemon thread, waited on for at most timeout_s (> 0) seconds. Past the bound the thread gets an
    asynchronous CallTimeout (which ends pure-Python loops) and is abandoned if it is stuck in C code; its result
    is never read. Converting what fn returns belongs inside fn, so it is bounded too."""
    box: dict = {}

    def target():
        try:  # the outer try: a timeout may also land while an exception is being explained
            try:
                box["value"] = fn()
            except CallTimeout:
                box["timeout"] = True
            except BaseException as err:  # noqa: BLE001 - SystemExit, KeyboardInterrupt from user code too
                try:
                    box["error"] = (err, explain(err))
                except Exception:  # noqa: BLE001 - an exception whose explanation fails still has a type
                    box["error"] = (err, type(err).__name__)
        except CallTimeout:
            box["timeout"] = True

    saved = _read_kept()
    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    worker.join(timeout_s)
    try:
        return _outcome(worker, box)
    finally:
        _put_back(saved)


def _outcome(worker: threading.Thread, box: dict) -> Guarded:
    if worker.is_alive():
        if not isinstance(sys.unraisablehook, _QuietTimeouts):
            sys.unraisablehook = _QuietTimeouts(sys.unraisablehook)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(CallTimeout))
        worker.join(0.5)  # pure-Python loops end here; a thread stuck in C code is abandoned (daemon)
        if worker.is_alive():
            ABANDONED.append(worker)
        return Guarded(timed_out=True)
    if "error" in box:
        return Guarded(error=box["error"][0], explained=box["error"][1])
    if "value" not in box:  # a timeout, also one that landed after the call but before its value was kept
        return Guarded(timed_out=True)
    return Guarded(value=box["value"])


def _fail(spec: str, why: str, key: str = "rewards.funcs") -> UserError:
    return UserError(why, key=key, value=spec)


def _load_file(spec: str, path: Path, key: str, kind: str):
    with user_path(key, spec):
        if path.is_dir():
            return None, _fail(spec, f"{str(path)!r} is a folder; give 'file.py:{kind}' or 'module:{kind}'", key)
        if not path.is_file():
            return None, _fail(
                spec,
                f"file {str(path)!r} not found; give 'file.py:{kind}' with an existing file or 'module:{kind}'",
                key,
            )
        resolved = str(path.resolve())
    name = "grpo_user_reward_" + hashlib.sha1(resolved.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    module = sys.modules.get(name)
    if module is None:
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module  # dataclasses / pickling inside the file need it registered
        try:
            mod_spec.loader.exec_module(module)
        except BaseException as err:  # a half-run module must not be found next time
            del sys.modules[name]
            if not isinstance(err, (Exception, SystemExit)):  # sys.exit() at import must not end the trainer
                raise
            return None, _fail(spec, f"loading {path.name} raised {describe(err)}", key)
    return module, None


def load(
    spec: str,
    key: str = "rewards.funcs",
    kind: str = "function",
    builtins: str = "`grpo-studio rewards`",
    bound: tuple[str, float] | None = None,
):
    """The callable named by 'path/to/file.py:name' or 'package.module:name' (kind: what it should be, a
    function or a class, as the errors name it; builtins: where the built-in names are listed). With `bound`
    (a time bound in words and in seconds: environments) it is found guarded, so a module that hangs at import,
    or raises KeyboardInterrupt there, is one line too."""
    if bound is None:
        return _find(spec, key, kind, builtins)
    done = guarded(lambda: _find(spec, key, kind, builtins), bound[1], describe)
    target = spec.rpartition(":")[0]
    loading = f"loading {Path(target).name if target.endswith('.py') else target}"
    if isinstance(done.error, UserError):
        raise done.error
    if done.error is not None:
        raise _fail(spec, f"{loading} raised {done.explained}", key)
    if done.timed_out:
        raise _fail(spec, f"{loading} ran past {bound[0]}", key)
    return done.value


# Objects the Python API (grpo_studio.GRPOTrainer) hands the engine in this process, named in the config as
# 'py:NAME': reward functions, environment factories. They exist only while the script that made them runs.
REGISTRY: dict[str, object] = {}
REGISTERED = "py"


def register(obj, name: str) -> str:
    """`obj` under the first free 'py:NAME' (NAME, NAME_2, ...), the spec a config names it by."""
    base, k = name, 2
    while REGISTRY.get(name, obj) is not obj:
        name, k = f"{base}_{k}", k + 1
    REGISTRY[name] = obj
    return f"{REGISTERED}:{name}"


def _find(spec: str, key: str, kind: str, builtins: str):
    target, sep, name = spec.rpartition(":")
    if target == REGISTERED:
        if name not in REGISTRY:
            raise _fail(
                spec,
                f"a {kind} the Python script that started this run passed in memory; run that script again "
                f"(trainer.train(resume_from_checkpoint=True) resumes)",
                key,
            )
        return REGISTRY[name]
    if not sep or not target or not name:
        raise _fail(spec, f"expected a built-in name (see {builtins}), 'file.py:{kind}' or 'module:{kind}'", key)
    if target.endswith(".py") or "/" in target or "\\" in target:
        if not target.endswith(".py"):  # a path, but Python loads modules from .py files only
            raise _fail(spec, f"{target!r} is not a .py file; give 'file.py:{kind}' or 'module:{kind}'", key)
        module, err = _load_file(spec, Path(target).expanduser(), key, kind)
        if err:
            raise err
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise _fail(spec, f"cannot import module {target!r} ({err}); a file path must end in .py", key) from None
        except (Exception, SystemExit) as err:
            raise _fail(spec, f"importing {target!r} raised {describe(err)}", key) from None
    found = getattr(module, name, None)
    if found is None or not callable(found):
        test = inspect.isclass if kind == "class" else inspect.isfunction
        there = sorted(
            n
            for n, v in vars(module).items()
            if test(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        shown = ", ".join(there) if there else "none"
        what = "is not callable" if found is not None else "not found"
        plural = {"function": "functions", "class": "classes"}[kind]
        raise _fail(spec, f"{kind} {name!r} {what} in {target}; {plural} there: {shown}", key)
    return found
