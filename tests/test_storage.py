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
    from pmi_jax.errors import OutputExists, PathError

    existing = tmp_path / "out"
    existing.mkdir()
    with pytest.raises(OutputExists) as raised:  # storage names the path; the command names the flag
        storage.check_writable(str(existing), overwrite=False, directory=True)
    assert (raised.value.path, str(raised.value)) == (str(existing), f"{existing}: already exists")
    storage.check_writable(str(existing), overwrite=True, directory=True)
    storage.check_writable(str(tmp_path / "new"), overwrite=False, directory=True)
    with pytest.raises(PathError, match="is a directory; name a file"):  # a file output
        storage.check_writable(str(existing), overwrite=True)
    # The CLI commands that write an --output share the check and its one-line error.
    assert main(["demo-corpus", "--output", str(existing)]) == 2
    assert capsys.readouterr().err.endswith(f"--output {existing}: already exists (pass --overwrite to replace it)\n")
    assert list(existing.iterdir()) == []


def test_overwriting_a_directory_never_deletes_inside_the_live_output(tmp_path, monkeypatch):
    """The old output is renamed aside whole before the new one is renamed in: no file of `path`
    is ever deleted in place, so a kill leaves `path` old-and-complete, absent, or new-and-complete."""
    target = tmp_path / "vocab"
    target.mkdir()
    for name in ("masking_vocab.txt", "masking_vocab.tsv", "stats.json"):
        (target / name).write_text("old")
    deleted, states = [], []
    real_rmtree, real_remove, real_rename = storage.gfile.rmtree, storage.gfile.remove, storage.gfile.rename

    def record(real, log):
        def call(path, *args, **kwargs):
            log.append(str(path))
            result = real(path, *args, **kwargs)
            states.append(sorted(p.name for p in target.iterdir()) if target.exists() else None)
            return result
        return call

    monkeypatch.setattr(storage.gfile, "rmtree", record(real_rmtree, deleted))
    monkeypatch.setattr(storage.gfile, "remove", record(real_remove, deleted))
    monkeypatch.setattr(storage.gfile, "rename", record(real_rename, []))
    with storage.atomic_directory(str(target), overwrite=True) as tmp:
        for name in ("masking_vocab.txt", "masking_vocab.tsv", "stats.json"):
            storage.gfile.GFile(storage.join(tmp, name), "w").write("new")
    assert not [p for p in deleted if p == str(target) or p.startswith(str(target) + "/")]
    complete = ["masking_vocab.tsv", "masking_vocab.txt", "stats.json"]
    assert all(state in (None, complete) for state in states)
    assert (target / "stats.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab"]


def test_the_next_run_sweeps_what_killed_runs_left(tmp_path, caplog):
    import os
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = socket.gethostname()
    (tmp_path / f".out.tmp-work-0123456789ab-{dead_pid}-{host}").mkdir()  # a killed run's directory
    (tmp_path / ".out.tmp-0123456789ab").write_text("x")                   # a file named before owners were recorded
    live = tmp_path / f".out.tmp-work-ba9876543210-{os.getpid()}-{host}"  # a live run's work in progress
    live.mkdir()
    (tmp_path / ".other.tmp-work-0123456789ab").write_text("x")            # another output's: not ours to sweep
    # A directory named before the kinds were may be an older version's aside: kept, with a warning.
    older = tmp_path / f".out.tmp-0123456789ab-{dead_pid}-{host}"
    older.mkdir()
    removed = storage.sweep_temporaries(str(tmp_path / "out"))
    assert len(removed) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, older.name, ".other.tmp-work-0123456789ab"])
    assert f"kept {older}, which may hold an earlier output" in caplog.text
