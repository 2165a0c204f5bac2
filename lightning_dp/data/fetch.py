"""The shared data sets from their canonical public sources, checked by SHA-256: ``python -m lightning_dp.data``.

Each file is downloaded into a temporary file beside its destination, hashed while it streams, and moved
into place only when its size and SHA-256 are those of the published file; a wrong digest leaves nothing
behind. The digests are those of the files as the sources publish them (the same bytes as ``../shared/data``).
This is the only code of the project that opens a network connection, and only when asked to.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from lightning_dp.errors import UserError

DEFAULT_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "data"  # as lightning_dp.data.sources
TIMEOUT_S = 30.0
CHUNK = 1 << 16


class OfflineError(UserError):
    """No source of a file could be reached (exit 3); the message says how to fetch it by hand."""


class ChecksumError(UserError):
    """A file's bytes are not the published ones (exit 4); nothing was written."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a data set: its name in the data set's folder, its size and SHA-256, and where to get it
    (the canonical source first, then mirrors that serve the same bytes)."""

    name: str
    sha256: str
    size: int
    urls: tuple[str, ...]


@dataclass(frozen=True)
class DataSet:
    name: str
    folder: str
    source: str
    licence: str
    files: tuple[RemoteFile, ...]


UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases"
DATASETS: dict[str, DataSet] = {
    "adult": DataSet(
        "adult", "adult", "UCI Machine Learning Repository: Adult (Becker & Kohavi, 1996), doi:10.24432/C5XW20",
        "CC BY 4.0",
        (RemoteFile("adult.data", "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d", 3974305,
                    (f"{UCI}/adult/adult.data",)),
         RemoteFile("adult.test", "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05", 2003153,
                    (f"{UCI}/adult/adult.test",)))),
    "cervical": DataSet(
        "cervical", "cervical", "UCI Machine Learning Repository: Cervical cancer (Risk Factors) (Fernandes, Cardoso "
        "& Fernandes, 2017), doi:10.24432/C5Z310", "CC BY 4.0",
        (RemoteFile("risk_factors_cervical_cancer.csv",
                    "8df193ad5c9ff4288fb4c401eef70dcd2cbda404ce7f82ac74c68cfc960ab063", 102059,
                    (f"{UCI}/00383/risk_factors_cervical_cancer.csv",)),)),
    "mnist": DataSet(
        "mnist", "mnist-test", "MNIST test split (LeCun, Cortes & Burges); yann.lecun.com no longer serves it, so from "
        "the mirrors PyTorch and TensorFlow use (the same published bytes)", "CC BY-SA 3.0",
        (RemoteFile("t10k-images-idx3-ubyte.gz", "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
                    1648877, ("https://ossci-datasets.s3.amazonaws.com/mnist/t10k-images-idx3-ubyte.gz",
                              "https://storage.googleapis.com/cvdf-datasets/mnist/t10k-images-idx3-ubyte.gz")),
         RemoteFile("t10k-labels-idx1-ubyte.gz", "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
                    4542, ("https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels-idx1-ubyte.gz",
                           "https://storage.googleapis.com/cvdf-datasets/mnist/t10k-labels-idx1-ubyte.gz")))),
}
ALIASES = {"mnist_test": "mnist", "mnist-test": "mnist"}

Opener = Callable[[str, float], IO[bytes]]


def _open(url: str, timeout: float) -> IO[bytes]:
    return urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 - fixed https URLs, or file:// in tests


def data_set(name: str) -> DataSet:
    """The data set called ``name`` (``mnist_test`` is ``mnist``).

    Raises:
        UserError: an unknown name, with the valid ones.
    """
    key = ALIASES.get(name, name)
    if key not in DATASETS:
        raise UserError(f"Unknown data set {name!r}; the fetchable ones are {', '.join(DATASETS)} (breast_cancer, "
                        "diabetes and digits ship with scikit-learn).")
    return DATASETS[key]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def file_status(path: Path, remote: RemoteFile) -> str:
    """``ok``, ``missing`` or ``wrong digest``."""
    if not path.is_file():
        return "missing"
    return "ok" if path.stat().st_size == remote.size and sha256_of(path) == remote.sha256 else "wrong digest"


def verify(name: str, root: str | Path | None = None) -> dict[str, str]:
    """Each file of the data set under ``root`` and its status (:func:`file_status`)."""
    ds = data_set(name)
    folder = Path(root or DEFAULT_ROOT) / ds.folder
    return {remote.name: file_status(folder / remote.name, remote) for remote in ds.files}


def _download(remote: RemoteFile, dest: Path, opener: Opener, timeout: float) -> str:
    """Fetch ``remote`` into ``dest`` atomically after checking its size and digest; the URL used.

    Raises:
        OfflineError: no URL could be read.
        ChecksumError: the bytes read are not the published file (nothing is left behind).
    """
    reasons = []
    for url in remote.urls:
        fd, tmp = tempfile.mkstemp(prefix=f".{remote.name}.", suffix=".part", dir=dest.parent)
        try:
            digest, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out, opener(url, timeout) as response:
                for block in iter(lambda: response.read(CHUNK), b""):
                    digest.update(block)
                    size += len(block)
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
            if size != remote.size or digest.hexdigest() != remote.sha256:
                raise ChecksumError(f"{url} gave {size:,} bytes with SHA-256 {digest.hexdigest()}, not the published "
                                    f"{remote.name} ({remote.size:,} bytes, {remote.sha256}); nothing was written. A proxy "
                                    "or a changed source: download it by hand (below) and check it with verify.")
            os.replace(tmp, dest)
            return url
        except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
            reasons.append(f"{url}: {getattr(err, 'reason', err)}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise OfflineError(f"Cannot download {remote.name} ({'; '.join(reasons)}).")


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a failed fetch created (innermost first) where they are still empty."""
    for path in folders:
        with contextlib.suppress(OSError):
            path.rmdir()


def fetch(name: str, root: str | Path | None = None, *, opener: Opener | None = None, timeout: float = TIMEOUT_S,
          say: Callable[[str], None] = print) -> Path:
    """Download the data set's files that are missing (or differ) into ``root/<folder>``, each checked by SHA-256.

    Returns:
        The data set's folder.

    Raises:
        UserError: an unknown name or a folder that cannot be written (exit 2).
        OfflineError: a source cannot be reached (exit 3). ChecksumError: wrong bytes (exit 4).
    """
    ds = data_set(name)
    folder = Path(root or DEFAULT_ROOT).expanduser() / ds.folder
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # removed again if nothing is fetched
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"Cannot create {str(folder)!r} ({err.strerror or err}). Pass --root PATH to a folder you can "
                        "write, and data.root=PATH to train.py.") from err
    if not os.access(folder, os.W_OK):
        raise UserError(f"{str(folder)!r} is not writable. Pass --root PATH to a folder you can write, and "
                        "data.root=PATH to train.py.")
    for remote in ds.files:
        dest = folder / remote.name
        status = file_status(dest, remote)
        if status == "ok":
            say(f"{dest}: already there, SHA-256 ok")
            continue
        try:
            url = _download(remote, dest, opener or _open, timeout)
        except ChecksumError:
            _remove_empty(created)
            raise
        except OfflineError as err:
            _remove_empty(created)
            from lightning_dp.errors import python_command

            urls = " ".join(r.urls[0] for r in ds.files)
            root_arg = "" if root is None else f" --root {root}"
            raise OfflineError(f"{err} Offline? On a machine with network download {urls}, copy the files into "
                               f"a folder {folder}/ (create it), then check them: {python_command()} -m "
                               f"lightning_dp.data verify {ds.name}{root_arg}") from err
        say(f"{dest}: {remote.size:,} bytes from {url}, SHA-256 ok" + (" (replaced a file with a wrong digest)"
                                                                       if status == "wrong digest" else ""))
    return folder
