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


# What each module of the package may import from the package: the layers,
# leaves first. A module not listed may import nothing of it.
LAYERS = {
    "errors": set(),
    "proto": set(),
    "fence": {"errors"},
    "_types": {"errors", "proto"},
    "_request": {"proto"},
    "_conn": {"errors", "_request", "proto"},
    "_settings": {"errors", "_types", "proto"},
    "_pool": {"errors", "_conn", "_request", "_settings", "_types", "proto"},
    "_ops": {"errors", "_pool", "_request", "_settings", "_types", "proto"},
    "_watch": {"errors", "_request"},
    "_held": {"errors", "_ops", "_request", "_types", "_watch", "proto"},
    "client": {"errors", "_held", "_ops", "_pool", "_settings", "_types", "_watch"},
    "sync": {"errors", "_held", "_ops", "_types", "_watch", "client"},
    "__init__": {"errors", "fence", "proto", "client", "sync"},
}


def test_layering() -> None:
    """A connection knows nothing of the client; the pool nothing of the
    operations; the operations nothing of held locks, watches or the public
    face; a watch nothing of the connections that carry it."""
    import ast
    from pathlib import Path

    src = Path(lockd.__file__).parent
    seen = set()
    for path in sorted(src.glob("*.py")):
        mod = path.stem
        seen.add(mod)
        got: set[str] = set()
        tree = ast.parse(path.read_text("utf-8"))
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue  # an annotation's import, not a dependency at run time
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    got.add(node.module.split(".")[0])
                else:
                    got.update(a.name for a in node.names)
        assert mod in LAYERS, f"{mod}.py: add it to LAYERS"
        extra = got - LAYERS[mod]
        assert not extra, f"{mod}.py imports {sorted(extra)} of the package; its layer allows {sorted(LAYERS[mod])}"
    assert seen == set(LAYERS), sorted(set(LAYERS) - seen)
