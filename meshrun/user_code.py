"""The user's own code, named in a config as `module:attribute` (model.factory, data.factory).

Modules are imported with the working dir on the import path, as `python -m` would have it (the
`meshrun` console script alone does not put it there). Every way this can go wrong is a
ConfigError naming the config key: a module that is not found (saying where meshrun looked), one
that fails while importing, a missing or uncallable attribute, keyword arguments the function does
not take, and an exception raised by the call (its first line).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from meshrun.errors import ConfigError
from meshrun.wording import did_you_mean, error_text, one_of


def check_reference(key: str, value: Any, example: str) -> None:
    """ConfigError unless `value` is written `module:attribute` (checked without importing)."""
    module, _, attribute = str(value or "").partition(":")
    if not isinstance(value, str) or not module or not attribute:
        raise ConfigError(key, f"got {value!r}; expected module:function, e.g. {example}")


def load_callable(key: str, reference: str) -> Callable:
    """The callable `reference` (`module:attribute`) names, imported with the working dir first on
    the import path."""
    module_name, _, attribute = reference.partition(":")
    _working_dir_importable()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):  # the module itself, not one it imports
            raise ConfigError(
                key, f"got {reference!r}: no module {module_name!r} {_where_searched()}"
            ) from None
        raise ConfigError(
            key, f"got {reference!r}: importing {module_name!r} failed ({_failure(err)})"
        ) from None
    except Exception as err:  # the user's module may fail in any way while importing
        raise ConfigError(
            key, f"got {reference!r}: importing {module_name!r} failed ({_failure(err)})"
        ) from None
    if not hasattr(module, attribute):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise ConfigError(
            key,
            f"got {reference!r}: module {module_name!r} has no function "
            f"{attribute!r} ({getattr(module, '__file__', None) or 'a namespace'}); "
            + did_you_mean(attribute, names)
            + f"it has: {one_of(sorted(names)[:12])}",
        )
    function = getattr(module, attribute)
    if not callable(function):
        raise ConfigError(
            key, f"got {reference!r}: {attribute!r} is a {type(function).__name__}, not a function or class"
        )
    return function


def check_kwargs(
    key: str,
    function: Callable,
    reference: str,
    kwargs: dict,
    fixed: tuple[str, ...] = (),
    passed_on: tuple[str, ...] | None = None,
) -> None:
    """ConfigError on `key` when `function` does not take `kwargs` (besides the arguments in
    `fixed` that meshrun passes itself), or needs arguments that nobody gives it. A function with
    **kwargs takes any name, unless `passed_on` lists the names its **kwargs accepts."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # builtins and some C functions have none: let the call decide
        return
    params = signature.parameters
    takes_any = passed_on is None and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [
        n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in fixed
    ]
    unknown = [k for k in kwargs if k not in named and k not in (passed_on or ()) and not takes_any]
    if unknown:
        raise ConfigError(
            key,
            f"got {unknown[0]!r}, which {reference} does not take; "
            + did_you_mean(unknown[0], named)
            + f"it takes: {one_of(named) if named else 'no keyword arguments'}",
        )
    missing = [
        n
        for n in named
        if params[n].default is inspect.Parameter.empty
        and n not in kwargs
        and params[n].kind is not inspect.Parameter.VAR_POSITIONAL
    ]
    if missing:
        raise ConfigError(
            key, f"is missing {one_of(missing)}: {reference} requires {'it' if len(missing) == 1 else 'them'}"
        )


def call(key: str, described: str, function: Callable, **kwargs) -> Any:
    """`function(**kwargs)`, with any exception it raises turned into a ConfigError on `key` naming
    the call (as `described` writes it) and the first line of the error."""
    try:
        return function(**kwargs)
    except ConfigError:
        raise
    except Exception as err:  # user code: any failure is reported as the call's
        raise ConfigError(key, f"{described} raised {_failure(err)}") from None


def _failure(err: Exception) -> str:
    """The user code's error as one line; for TensorFlow not being installed (a tf.data factory
    run where meshrun is installed without its `tf` extra), how to install it."""
    if isinstance(err, ModuleNotFoundError) and (err.name or "").partition(".")[0] == "tensorflow":
        from meshrun.compat.tensorflow import TENSORFLOW_INSTALL

        return f"{error_text(err)}; TensorFlow is not installed: {TENSORFLOW_INSTALL}"
    return error_text(err)


def _working_dir_importable() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _where_searched() -> str:
    others = [p for p in sys.path if p and p != os.getcwd()]
    return (
        f"in the working dir {os.getcwd()} or on the Python path ({len(others)} more dirs); put it in the "
        "working dir or add its folder to PYTHONPATH"
    )
