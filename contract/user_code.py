"""User code named in a config: reward functions (`rewards.funcs = ["my_rewards.py:score"]` or
`["my_pkg.rewards:score"]`) and environment classes (`env.environment = "my_env.py:Wordle"`).

A file path is resolved against the working directory (absolute paths work as is) and loaded as
a module of its own; `module:name` is imported with importlib. Every failure is one
UserError line naming the config key, the entry and what is allowed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from grpo_studio.contract.errors import UserError, describe, user_path


def _fail(spec: str, why: str, key: str = "rewards.funcs") -> UserError:
    return UserError(why, key=key, value=spec)


def _load_file(spec: str, path: Path, key: str, kind: str):
    with user_path(key, spec):
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
        except (Exception, SystemExit) as err:  # sys.exit() at import must not end the trainer
            del sys.modules[name]
            return None, _fail(spec, f"loading {path.name} raised {describe(err)}", key)
    return module, None


def load(spec: str, key: str = "rewards.funcs", kind: str = "function", builtins: str = "`grpo-studio rewards`"):
    """The callable named by 'path/to/file.py:name' or 'package.module:name' (kind: what it should be, a
    function or a class, as the errors name it; builtins: where the built-in names are listed)."""
    target, sep, name = spec.rpartition(":")
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
