"""The PEP 517 build backend of the lockd package: the standard library only.

``pip install ./clients/python`` builds in an isolated environment that pip
fills from the package index with whatever ``[build-system] requires``
lists, and setuptools' backend asks for more (``wheel``) as it runs: offline,
in a virtual environment, that fails. The package is a handful of pure
Python files, so this backend builds the wheel (and the sdist, and the
editable wheel of PEP 660) itself, with :mod:`zipfile`, :mod:`tarfile` and
:mod:`tomllib`: it requires nothing, needs no network, and writes only the
archive it is asked for, into the directory pip gives it (never ``build/`` or
``*.egg-info`` into the source tree). Any Python the package supports
(>= 3.11, which has :mod:`tomllib`) can run it.

What goes in: ``src/lockd/*.py`` and ``py.typed``; the metadata comes from
``[project]`` in ``pyproject.toml`` (name, version, description, readme,
requires-python, classifiers; the package has no dependencies).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "lockd"
TAG = "py3-none-any"
# Archive members carry this date unless SOURCE_DATE_EPOCH says otherwise,
# so that a build is reproducible (zip cannot store dates before 1980).
_EPOCH_DEFAULT = 315532800  # 1980-01-01


def _project() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        proj: dict[str, Any] = tomllib.load(f)["project"]
    if proj.get("dependencies"):
        raise RuntimeError("lockd_build: the package must not have dependencies (this backend does not write them)")
    return proj


def _dist(proj: dict[str, Any]) -> str:
    return f"{proj['name'].replace('-', '_')}-{proj['version']}"


def _metadata(proj: dict[str, Any]) -> bytes:
    """The core metadata (METADATA, PKG-INFO), version 2.1."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {proj['name']}",
        f"Version: {proj['version']}",
    ]
    if proj.get("description"):
        lines.append(f"Summary: {proj['description']}")
    if proj.get("requires-python"):
        lines.append(f"Requires-Python: {proj['requires-python']}")
    for c in proj.get("classifiers", []):
        lines.append(f"Classifier: {c}")
    body = ""
    readme = proj.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        body = (ROOT / readme).read_text("utf-8")
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _files() -> list[tuple[str, bytes]]:
    """The package's files: (path in the wheel, content)."""
    out = []
    for p in sorted(PKG.iterdir()):
        if p.is_file() and (p.suffix == ".py" or p.name == "py.typed"):
            out.append((f"lockd/{p.name}", p.read_bytes()))
    if not any(name == "lockd/__init__.py" for name, _ in out):
        raise RuntimeError(f"lockd_build: no package at {PKG}")
    return out


def _epoch() -> int:
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", _EPOCH_DEFAULT)), _EPOCH_DEFAULT)


def _dist_info(proj: dict[str, Any]) -> list[tuple[str, bytes]]:
    di = f"{_dist(proj)}.dist-info"
    wheel = f"Wheel-Version: 1.0\nGenerator: lockd_build\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    return [
        (f"{di}/METADATA", _metadata(proj)),
        (f"{di}/WHEEL", wheel.encode()),
        (f"{di}/top_level.txt", b"lockd\n"),
    ]


def _wheel(directory: str, editable: bool) -> str:
    proj = _project()
    name = f"{_dist(proj)}-{TAG}.whl"
    if editable:
        # PEP 660: a .pth file puts the source tree on sys.path.
        files = [(f"__editable__.{_dist(proj)}.pth", (str(PKG.parent) + "\n").encode())]
    else:
        files = _files()
    files += _dist_info(proj)
    record = f"{_dist(proj)}.dist-info/RECORD"
    rows = []
    date = time.gmtime(_epoch())[:6]
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{path},sha256={digest},{len(data)}")
        rows.append(f"{record},,")
        zi = zipfile.ZipInfo(record, date)
        zi.external_attr = 0o644 << 16
        z.writestr(zi, "\n".join(rows) + "\n")
    return name


def _metadata_dir(directory: str) -> str:
    proj = _project()
    di = Path(directory) / f"{_dist(proj)}.dist-info"
    di.mkdir(parents=True, exist_ok=True)
    for path, data in _dist_info(proj):
        (Path(directory) / path).write_bytes(data)
    return di.name


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    """Nothing: the standard library builds it."""
    return []


def get_requires_for_build_sdist(config_settings: Any = None) -> list[str]:
    """Nothing: the standard library builds it."""
    return []


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    """Nothing: the standard library builds it."""
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Any = None) -> str:
    """Write the wheel's .dist-info into ``metadata_directory``."""
    return _metadata_dir(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: Any = None) -> str:
    """Write the editable wheel's .dist-info into ``metadata_directory``."""
    return _metadata_dir(metadata_directory)


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None) -> str:
    """Build the wheel into ``wheel_directory``; return its file name."""
    return _wheel(wheel_directory, editable=False)


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None) -> str:
    """Build an editable wheel (PEP 660) into ``wheel_directory``."""
    return _wheel(wheel_directory, editable=True)


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    """Build the sdist (the package, the backend, pyproject.toml, README.md
    and PKG-INFO) into ``sdist_directory``; return its file name."""
    proj = _project()
    base = _dist(proj)
    name = f"{base}.tar.gz"
    members: list[tuple[str, bytes]] = [(f"src/{path}", data) for path, data in _files()]
    members += [
        ("pyproject.toml", (ROOT / "pyproject.toml").read_bytes()),
        ("_build/lockd_build.py", Path(__file__).read_bytes()),
        ("PKG-INFO", _metadata(proj)),
    ]
    if proj.get("readme"):
        members.append((proj["readme"], (ROOT / proj["readme"]).read_bytes()))
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for path, data in sorted(members):
            ti = tarfile.TarInfo(f"{base}/{path}")
            ti.size = len(data)
            ti.mode = 0o644
            ti.mtime = _epoch()
            tf.addfile(ti, io.BytesIO(data))
    return name
