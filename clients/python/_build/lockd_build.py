"""The PEP 517 build backend of the lockd package: setuptools' build_meta,
found without the network.

``pip install ./clients/python`` builds in an isolated environment that hides
the interpreter's own site-packages and fills it from the package index with
what ``[build-system] requires`` lists; offline, ``requires = ["setuptools"]``
fails even where the system ships setuptools (Debian's python3-setuptools).
So this backend requires nothing up front. It uses setuptools (and wheel) from
the isolated environment if pip put them there, else from the interpreter's
own site-packages, and only when neither has them does it ask pip for them
(``get_requires_for_build_*``), which then needs the index, as a plain
setuptools project would.
"""

from __future__ import annotations

import importlib.util
import site
import sys
from typing import Any

_FALLBACK = ["setuptools>=61", "wheel"]


def _add_site_packages() -> None:
    """Put the interpreter's site-packages, then (in a venv) its base
    interpreter's, at the end of sys.path: where the system's setuptools and
    wheel are, behind whatever pip's isolated environment holds."""
    for p in site.getsitepackages() + site.getsitepackages([sys.base_prefix]):
        if p not in sys.path:
            sys.path.append(p)


def _build_meta() -> Any:
    """setuptools.build_meta, or None if no setuptools can be found."""
    _add_site_packages()
    try:
        from setuptools import build_meta
    except ImportError:
        return None
    return build_meta


def _missing(reqs: list[str]) -> list[str]:
    """The requirements that cannot be imported from sys.path as it is."""
    out = []
    for r in reqs:
        name = r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()
        if importlib.util.find_spec(name) is None:
            out.append(r)
    return out


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    bm = _build_meta()
    if bm is None:
        return list(_FALLBACK)
    return _missing(list(bm.get_requires_for_build_wheel(config_settings)))


def get_requires_for_build_sdist(config_settings: Any = None) -> list[str]:
    bm = _build_meta()
    if bm is None:
        return list(_FALLBACK)
    return _missing(list(bm.get_requires_for_build_sdist(config_settings)))


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    bm = _build_meta()
    if bm is None:
        return list(_FALLBACK)
    return _missing(list(bm.get_requires_for_build_editable(config_settings)))


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Any = None) -> str:
    return str(_build_meta().prepare_metadata_for_build_wheel(metadata_directory, config_settings))


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: Any = None) -> str:
    return str(_build_meta().prepare_metadata_for_build_editable(metadata_directory, config_settings))


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None) -> str:
    return str(_build_meta().build_wheel(wheel_directory, config_settings, metadata_directory))


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None) -> str:
    return str(_build_meta().build_editable(wheel_directory, config_settings, metadata_directory))


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    return str(_build_meta().build_sdist(sdist_directory, config_settings))
