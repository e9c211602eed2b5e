"""User reward functions: `rewards.funcs = ["my_rewards.py:score"]` or `["my_pkg.rewards:score"]`.

A file path is resolved against the working directory (absolute paths work as is) and loaded as
a module of its own; `module:function` is imported with importlib. Every failure is one
UserError line naming the entry and what is allowed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from grpo_studio.contract.errors import UserError, describe, user_path


def _fail(spec: str, why: str) -> UserError:
    return UserError(why, key="rewards.funcs", value=spec)


def _load_file(spec: str, path: Path):
    with user_path("rewards.funcs", spec):
        if not path.is_file():
            return None, _fail(
                spec,
                f"file {str(path)!r} not found; give 'file.py:function' with an existing file or 'module:function'",
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
        except (Exception, SystemExit) as err:  # sys.exit() at import must not end the trainer
            del sys.modules[name]
            return None, _fail(spec, f"loading {path.name} raised {describe(err)}")
    return module, None


def load(spec: str):
    """The callable named by 'path/to/file.py:function' or 'package.module:function'."""
    target, sep, func_name = spec.rpartition(":")
    if not sep or not target or not func_name:
        raise _fail(
            spec, "expected a built-in name (see `grpo-studio rewards`), 'file.py:function' or 'module:function'"
        )
    if target.endswith(".py") or "/" in target or "\\" in target:
        if not target.endswith(".py"):  # a path, but Python loads modules from .py files only
            raise _fail(spec, f"{target!r} is not a .py file; give 'file.py:function' or 'module:function'")
        module, err = _load_file(spec, Path(target).expanduser())
        if err:
            raise err
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise _fail(spec, f"cannot import module {target!r} ({err}); a file path must end in .py") from None
        except (Exception, SystemExit) as err:
            raise _fail(spec, f"importing {target!r} raised {describe(err)}") from None
    fn = getattr(module, func_name, None)
    if fn is None or not callable(fn):
        found = sorted(
            n
            for n, v in vars(module).items()
            if inspect.isfunction(v) and not n.startswith("_") and v.__module__ == module.__name__
        )
        shown = ", ".join(found) if found else "none"
        what = "is not callable" if fn is not None else "not found"
        raise _fail(spec, f"function {func_name!r} {what} in {target}; functions there: {shown}")
    return fn
