"""Fixtures shared by the test modules."""

import os

import pytest


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh AIAYN_CACHE for the module (corpora, tokenizers, encoded data), restored afterwards."""
    path = tmp_path_factory.mktemp("cache")
    old = os.environ.get("AIAYN_CACHE")
    os.environ["AIAYN_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("AIAYN_CACHE", None)
    else:
        os.environ["AIAYN_CACHE"] = old
