"""Where the models of a run come from: one `ModelSource` per model, the same for one model and for several (report,
compare), with one rule for labelling them, one for a model given twice and one way of freeing a model once read.

A source names the model (`label`, as tables, pictures and the JSON show it), says what it is (`name`, `revision`)
and how to have it (`load(lm_head)`); `owned` says whether attnscope loaded it for this run, and so frees it when
read (`close`): a model the caller loaded is used as it is and left alone. The Python API builds the sources from
what it is given (`attnscope.api`), the analyses of several models open them one at a time, so that memory holds one
model at once.

Labels: a revision when the models are revisions of one repository; else a folder's name, `demo`, or the Hub id as
given; where two would be the same, folders are told apart by their parent folders (`run1/final`, `run2/final`),
then anything still equal by its place (`demo#2`: two models of one name loaded and changed in memory).
A model given twice (the same folder, however spelled: a trailing slash, a link, `./`; the same Hub id at the same
revision; the same loaded object) is refused: comparing a model with itself says nothing, and labelling the second
copy would hide the mistake.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from attnscope.errors import AttnscopeError
from attnscope.models.loading import DEMO, LoadedModel, demo_model_dir
from attnscope.options import expanded_path


@dataclass(frozen=True)
class ModelSource:
    """One model of a run: its `label`, what it is (`name`, `revision`), `load(lm_head)`, which gives it, and
    whether attnscope `owned` it (loaded it for this run, and frees it once read)."""

    label: str
    name: str
    revision: str | None
    load: Callable[[bool], LoadedModel]
    owned: bool = True

    def open(self, lm_head: bool = False) -> LoadedModel:
        return self.load(lm_head)

    def close(self, loaded: LoadedModel) -> None:
        """Free `loaded`'s weights if this run loaded it (a model the caller gave is left as it is)."""
        if self.owned:
            release(loaded)

    @contextmanager
    def holding(self, loaded: LoadedModel) -> Iterator[LoadedModel]:
        """`loaded`, this source's model, for as long as the `with` lasts, then closed; an error a user can cause
        meanwhile names the model by its label (in a run of several, which of them holds NaN?), unless it names it
        already."""
        try:
            yield loaded
        except AttnscopeError as error:
            if f"'{self.label}'" in str(error):
                raise
            raise AttnscopeError(f"model '{self.label}': {error}") from error
        finally:
            self.close(loaded)


def release(loaded: LoadedModel) -> None:
    """Free a model's weights before the next model loads: they move to torch's `meta` device, which holds no data
    (so they go even where something else still refers to the module), and a GPU's cache gives the memory back. The
    config and the tokenizer stay, to check the next model against. No gc.collect: nothing holds the tensors in a
    cycle, and it took 0.25 s a model."""
    import torch

    owner = loaded.lm_model if loaded.lm_model is not None else loaded.model
    try:
        owner.to("meta")
    except (RuntimeError, ValueError, NotImplementedError):  # a model spread by accelerate: dropped, not moved
        pass
    if getattr(loaded.device, "type", None) == "cuda":
        torch.cuda.empty_cache()


def is_folder(name: str) -> bool:
    """Whether a model's name means a folder on this machine (a path, or a folder that exists), not a Hub id."""
    return name != DEMO and (name.startswith((".", "/", "~")) or os.path.isdir(os.path.expanduser(name)))


def name_notes(name: str) -> list[str]:
    """What a reader should know of how a model's name was read: `demo` is always the bundled model, even where a
    folder of that name lies in the current folder."""
    if name == DEMO and os.path.isdir(DEMO):
        return [f"{DEMO} is the bundled model; the folder ./{DEMO} was not used: give ./{DEMO} to use it"]
    return []


def label_of(name: str, revision: str | None = None) -> str:
    """How a model is named: its revision, a folder's name, `demo`, or its Hub id."""
    if revision is not None:
        return revision
    if is_folder(name):
        path = expanded_path(name, "--model")  # ~nosuchuser: one line, not Path's RuntimeError
        return path.resolve().name or str(path)
    return name


def identity(name: str, revision: str | None = None) -> tuple[str, str | None]:
    """What makes two names the same model: a folder's real path (a trailing slash, a link or `./` changes nothing),
    else the name itself, at its revision."""
    if name == DEMO:  # the bundled folder, however it is named
        return os.path.realpath(demo_model_dir()), None
    if is_folder(name):
        return os.path.realpath(os.path.expanduser(name)), None
    return name, revision


def labels(names: Sequence[str], revisions: Sequence[str | None]) -> tuple[list[str], str | None]:
    """The labels of models `names` at `revisions` (see the module docstring), and a note saying where two had to be
    told apart (None when none did)."""
    first = [label_of(name, revision) for name, revision in zip(names, revisions, strict=True)]
    shown = list(first)
    for label in set(first):
        same = [k for k, other in enumerate(first) if other == label]
        if len(same) < 2 or not all(is_folder(names[k]) and revisions[k] is None for k in same):
            continue
        parts = [expanded_path(names[k], "--model").resolve().parts for k in same]
        for depth in range(2, max(len(p) for p in parts) + 1):
            longer = ["/".join(p[-depth:]) for p in parts]
            if len(set(longer)) == len(longer):
                for k, text in zip(same, longer, strict=True):
                    shown[k] = text
                break
    seen: dict[str, int] = {}
    for k, label in enumerate(shown):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            shown[k] = f"{label}#{seen[label]}"
    changed = [f"{before} as {after}" for before, after in zip(first, shown, strict=True) if before != after]
    return shown, (f"models with the same name are labelled apart: {', '.join(changed)}" if changed else None)


def check_once(given: Sequence[Any], revisions: Sequence[str | None]) -> None:
    """Refuse a model given twice (see the module docstring): `given` holds names and loaded models."""
    seen: dict[Any, str] = {}
    for item, revision in zip(given, revisions, strict=True):
        if isinstance(item, LoadedModel):
            key: Any = ("loaded", id(item))
            shown = item.name
        else:
            key = identity(os.fspath(item), revision)
            shown = os.fspath(item) if revision is None else f"{os.fspath(item)} at {revision}"
        if key in seen:
            also = "" if seen[key] == shown else f" (as {seen[key]!r} and {shown!r})"
            raise AttnscopeError(f"model {shown!r} is given twice{also}: give each model once")
        seen[key] = shown


def check_name(name: Any) -> None:
    """A model's name: a non-empty string or path (a message never repeats an object's repr: a model's runs to
    thousands of characters)."""
    expected = "expected a model from attnscope.load or a name ('demo', a Hub id, a folder)"
    if isinstance(name, bytes) or not isinstance(name, (str, os.PathLike)):
        article = "an" if type(name).__name__[0] in "aeiou" else "a"
        raise AttnscopeError(f"model: {expected}, not {article} {type(name).__name__}")
    if not os.fspath(name).strip():
        raise AttnscopeError(f"model {os.fspath(name)!r}: {expected}")
