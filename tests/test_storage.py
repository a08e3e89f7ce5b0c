"""Atomic publication: a failure inside the block leaves neither partial output nor temp files."""
import pytest

from pmi_jax import storage


def test_atomic_file_replaces_only_on_success(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with storage.atomic_file(str(target)) as f:
            f.write("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    with storage.atomic_file(str(target)) as f:
        f.write("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_atomic_directory(tmp_path):
    target = tmp_path / "vocab"
    with pytest.raises(RuntimeError):
        with storage.atomic_directory(str(target), overwrite=False) as tmp:
            storage.gfile.GFile(storage.join(tmp, "a"), "w").write("x")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    with storage.atomic_directory(str(target), overwrite=False) as tmp:
        storage.gfile.GFile(storage.join(tmp, "a"), "w").write("x")
    assert (target / "a").read_text() == "x"
    with pytest.raises(FileExistsError):
        with storage.atomic_directory(str(target), overwrite=False):
            pass
    with storage.atomic_directory(str(target), overwrite=True) as tmp:
        storage.gfile.GFile(storage.join(tmp, "b"), "w").write("y")
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab"]


def test_an_existing_output_is_refused_before_any_work_unless_overwritten(tmp_path, capsys):
    from pmi_jax.cli import main
    from pmi_jax.errors import UserInputError

    existing = tmp_path / "out"
    existing.mkdir()
    with pytest.raises(UserInputError, match=rf"^--output {existing}: already exists \(pass --overwrite"):
        storage.check_new_output(str(existing), overwrite=False)
    storage.check_new_output(str(existing), overwrite=True)
    storage.check_new_output(str(tmp_path / "new"), overwrite=False)
    # The CLI commands that write an --output share the check and its one-line error.
    assert main(["demo-corpus", "--output", str(existing)]) == 2
    assert capsys.readouterr().err.endswith(f"--output {existing}: already exists (pass --overwrite to replace it)\n")
    assert list(existing.iterdir()) == []
