"""Files for --out land whole or not at all: the folder is checked first, the files are staged, then moved."""

import pytest

from attnscope import export
from attnscope.errors import AttnscopeError


def test_prepare_out_dir_checks_without_leaving_a_folder(tmp_path):
    folder = tmp_path / "new" / "deeper"
    assert export.prepare_out_dir(folder) == folder
    assert list(tmp_path.iterdir()) == []  # proven writable, nothing made
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(AttnscopeError, match="cannot write to --out"):
        export.prepare_out_dir(a_file / "sub")


def test_write_all_moves_every_file_into_the_folder(tmp_path):
    folder = tmp_path / "out" / "run"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("earlier")

    def write(stage):
        return [export.write_atomic(stage / name, name) for name in ("a.json", "b.csv")]

    assert export.write_all(folder, write) == [folder / "a.json", folder / "b.csv"]
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
            export.write_atomic(stage / "old.json", "new")
            export.write_atomic(stage / "second.csv", "x")
            raise stop  # as a Ctrl-C arriving while the third file is drawn

        with pytest.raises(stop):
            export.write_all(folder, write)
    assert not (tmp_path / "new").exists()  # the folders this run made are gone again
    assert [p.name for p in existing.iterdir()] == ["old.json"]  # an existing folder keeps what it had
    assert (existing / "old.json").read_text() == "old"
