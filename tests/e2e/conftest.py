"""End-to-end tier: the real CLI, in-process (the `cli` fixture of tests/conftest.py) or in subprocesses.

Loading a tiny model by path costs about half a second, nearly all of it reading the GPT-2 tokenizer's 50,000-entry
vocabulary; dozens of commands here load the same few folders. So, in-process, each (model, device, dtype, lm_head)
is loaded for real the first time a command asks for it (through `load_model`, every check included) and handed
back again afterwards. Failed loads are never remembered: every error case still runs the real loader. Subprocess
tests are untouched. A test that must see a fresh load asks for the `fresh_loads` fixture.
"""

from __future__ import annotations

import pytest

_LOADED: dict[tuple, object] = {}


@pytest.fixture(autouse=True)
def _remembered_loads(request, monkeypatch):
    if "fresh_loads" in request.fixturenames:
        yield
        return
    from attnscope.models import loading

    real = loading.load_model

    def load_model(*args, **kwargs):
        key = (tuple(str(arg) for arg in args), tuple(sorted(kwargs.items())))
        if key not in _LOADED or _released(_LOADED[key]):
            _LOADED[key] = real(*args, **kwargs)
        return _LOADED[key]

    monkeypatch.setattr(loading, "load_model", load_model)
    yield


def _released(loaded) -> bool:
    """Whether a remembered model was freed by a command that loaded it (compare and report of several free each
    model once read: models.sources.release moves its weights to torch's meta device): then it is loaded again."""
    owner = loaded.lm_model if loaded.lm_model is not None else loaded.model
    return next(owner.parameters()).device.type == "meta"


@pytest.fixture
def fresh_loads():
    """Every load of this test goes through the real loader."""
