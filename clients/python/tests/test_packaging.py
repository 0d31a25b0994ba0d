"""The package is ready to publish: metadata complete and the version in one place."""

from __future__ import annotations

import sys

import pytest

import sundial_client

from conftest import REPO

PYPROJECT = REPO / "clients" / "python" / "pyproject.toml"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is in the standard library from 3.11")
def test_metadata():
    import tomllib

    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["name"] == "sundial-client"
    assert project["version"] == sundial_client.__version__
    assert project["license"] == "Apache-2.0"
    assert project["readme"] == "README.md"
    assert (PYPROJECT.parent / "README.md").exists()
    assert (PYPROJECT.parent / "LICENSE").exists()
    assert any(d.startswith("httpx") for d in project["dependencies"])
    assert (PYPROJECT.parent / "src" / "sundial_client" / "py.typed").exists()
