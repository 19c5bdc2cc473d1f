"""Files for --out (output.files) land whole or not at all: the folder is checked first, the files are staged,
then moved."""

from __future__ import annotations

import os

import pytest

from attnscope.errors import AttnscopeError
from attnscope.output import files


def test_prepare_out_dir_checks_without_leaving_a_folder(tmp_path):
    folder = tmp_path / "new" / "deeper"
    assert files.prepare_out_dir(folder) == folder
    assert list(tmp_path.iterdir()) == []  # proven writable, nothing made
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(AttnscopeError, match="cannot write to --out"):
        files.prepare_out_dir(a_file / "sub")


def test_prepare_out_dir_leaves_an_existing_folder_as_it_was(tmp_path):
    (tmp_path / "keep.txt").write_text("earlier")
    assert files.prepare_out_dir(tmp_path) == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]  # no probe file left behind


def test_write_all_moves_every_file_into_the_folder(tmp_path):
    folder = tmp_path / "out" / "run"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("earlier")

    def write(stage):
        return [files.write_atomic(stage / name, name) for name in ("a.json", "b.csv")]

    assert files.write_all(folder, write) == [folder / "a.json", folder / "b.csv"]
    assert sorted(p.name for p in folder.iterdir()) == ["a.json", "b.csv"]  # no stage folder left
    assert (folder / "b.csv").read_text() == "b.csv"
    assert (tmp_path / "out" / "keep.txt").read_text() == "earlier"


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_write_leaves_nothing_behind(tmp_path, stop):
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "old.json").write_text("old")
    for folder in (tmp_path / "new" / "run", existing):

        def write(stage):
            files.write_atomic(stage / "old.json", "new")
            files.write_atomic(stage / "second.csv", "x")
            raise stop  # as a Ctrl-C arriving while the third file is drawn

        with pytest.raises(stop):
            files.write_all(folder, write)
    assert not (tmp_path / "new").exists()  # the folders this run made are gone again
    assert [p.name for p in existing.iterdir()] == ["old.json"]  # an existing folder keeps what it had
    assert (existing / "old.json").read_text() == "old"


def test_write_atomic_writes_text_and_bytes_with_ordinary_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        text = files.write_atomic(tmp_path / "a.csv", "x,y\r\n1,2\n")
        data = files.write_atomic(tmp_path / "b.png", b"\x89PNG\x00")
    finally:
        os.umask(mask)
    assert text.read_bytes() == b"x,y\r\n1,2\n"  # newlines written as given
    assert data.read_bytes() == b"\x89PNG\x00"
    assert oct(text.stat().st_mode & 0o777) == oct(0o644)  # what open() would give, not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.png"]  # no temporary left
