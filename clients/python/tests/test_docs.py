"""Every public name of the package has a docstring."""

from __future__ import annotations

import inspect
from types import ModuleType

import lockd
from lockd import client, errors, fence, proto, sync


def _missing(mod: ModuleType) -> list[str]:
    out = []
    if not (mod.__doc__ or "").strip():
        out.append(mod.__name__)
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name)
        if isinstance(obj, ModuleType) or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            out.append(f"{mod.__name__}.{name}")
        if inspect.isclass(obj):
            for attr, val in vars(obj).items():
                if attr.startswith("_") and attr not in ("__init__",):
                    continue
                if attr == "__init__":
                    continue
                if inspect.isfunction(val) or isinstance(val, (property, staticmethod, classmethod)):
                    doc = (val.fget.__doc__ if isinstance(val, property) else getattr(val, "__doc__", None)) or ""
                    if not doc.strip():
                        out.append(f"{mod.__name__}.{name}.{attr}")
    return out


def test_docstrings() -> None:
    missing = []
    for mod in (lockd, client, errors, fence, proto, sync):
        missing += _missing(mod)
    assert missing == []
