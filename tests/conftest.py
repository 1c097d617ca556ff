"""Fixtures shared by several test modules.

``tiny_model``: the course's tiny Llama (``pdlab.serve.engines.modelbuild``, preset ``tiny``), built once
per test session (about 10 s) into a temporary folder. It is a :class:`~pdlab.serve.engines.modelbuild.ModelBuild`:
tests that need a folder use ``tiny_model.path`` (the bench client's tokenizer, a live vLLM
deployment in tests/test_live.py), tests of the build itself read its other fields.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A freshly built ``tiny`` model (seed 0, the same as ``pdlab.serve.engines.modelbuild.tiny_model_dir``)."""
    from pdlab.serve.engines.modelbuild import build_model

    return build_model("tiny", tmp_path_factory.mktemp("models") / "tiny")
