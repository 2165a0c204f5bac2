"""python -m lightning_dp.data: downloads checked by SHA-256 (file:// sources, no network), offline and
wrong-digest behaviour (exit 3 / 4, nothing written), and the published digests against ../shared/data."""

from __future__ import annotations

import hashlib
import urllib.error

import pytest

from lightning_dp.data import fetch as fetch_mod
from lightning_dp.data.__main__ import main
from lightning_dp.data.fetch import DATASETS, DataSet, RemoteFile
from tests.conftest import SHARED_DATA


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A data set 'toy' of two files served from file:// URLs."""
    source = tmp_path / "source"
    source.mkdir()
    files = []
    for name, body in (("a.csv", b"x,y\n1,2\n"), ("b.csv", b"x,y\n3,4\n" * 1000)):
        (source / name).write_bytes(body)
        files.append(RemoteFile(name, hashlib.sha256(body).hexdigest(), len(body), ((source / name).as_uri(),)))
    monkeypatch.setitem(DATASETS, "toy", DataSet("toy", "toy-folder", "test files", "none", tuple(files)))
    return tmp_path / "root", source


def test_fetch_places_files_with_their_digest_and_verify_passes(toy, capsys):
    root, source = toy
    assert main(["fetch", "toy", "--root", str(root)]) == 0
    for name in ("a.csv", "b.csv"):
        assert (root / "toy-folder" / name).read_bytes() == (source / name).read_bytes()
    assert main(["verify", "toy", "--root", str(root)]) == 0
    assert main(["fetch", "toy", "--root", str(root)]) == 0  # again: nothing to download
    assert "already there, SHA-256 ok" in capsys.readouterr().out
    assert sorted(p.name for p in (root / "toy-folder").iterdir()) == ["a.csv", "b.csv"]  # no temporary files


def test_wrong_digest_exits_4_and_writes_nothing(toy, monkeypatch, capsys):
    root, source = toy
    (source / "b.csv").write_bytes(b"tampered\n")  # the source now serves other bytes
    assert main(["fetch", "toy", "--root", str(root)]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not the published b.csv" in err and err.count("\n") == 1
    assert sorted(p.name for p in (root / "toy-folder").iterdir()) == ["a.csv"]  # b.csv not written, no .part


def test_verify_finds_missing_and_changed_files(toy, capsys):
    root, _ = toy
    assert main(["verify", "toy", "--root", str(root)]) == 1
    assert "fetch toy --root" in capsys.readouterr().err
    assert main(["fetch", "toy", "--root", str(root)]) == 0
    (root / "toy-folder" / "a.csv").write_bytes(b"x,y\n1,3\n")  # same size, other bytes
    assert main(["verify", "toy", "--root", str(root)]) == 4
    assert "a.csv: wrong digest" in capsys.readouterr().out


def test_offline_exits_3_with_how_to_fetch_by_hand(tmp_path, monkeypatch, capsys):
    def offline(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(fetch_mod, "_open", offline)
    assert main(["fetch", "adult", "--root", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "Offline?" in err and "archive.ics.uci.edu/ml/machine-learning-databases/adult/adult.data" in err
    assert f"verify adult --root {tmp_path}" in err
    assert not (tmp_path / "adult").exists()  # no empty folder left behind
    root = tmp_path / "new" / "data"  # folders the fetch created are removed again
    assert main(["fetch", "adult", "--root", str(root)]) == 3
    assert not (tmp_path / "new").exists()


def test_bad_names_and_unwritable_roots_exit_2(tmp_path, capsys):
    assert main(["fetch", "imagenet", "--root", str(tmp_path)]) == 2
    assert "fetchable ones are adult, cervical, mnist" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["fetch", "adult", "--root", str(blocker)]) == 2


@pytest.mark.parametrize("name", list(DATASETS))
def test_published_digests_match_the_shared_files(name):
    folder = SHARED_DATA / DATASETS[name].folder
    if not folder.is_dir():
        pytest.skip(f"{folder} absent; fetch it with: .venv/bin/python -m lightning_dp.data fetch {name}")
    assert set(fetch_mod.verify(name, SHARED_DATA).values()) == {"ok"}
