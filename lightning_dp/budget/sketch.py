"""Keyed bottom-k sketches of a data set's rows, to see that a changed file is mostly the same rows.

A data set's fingerprint identifies its exact rows, so D plus one row would be a new data set with a fresh budget. The
registry therefore keeps, per version of a data set, the ``k`` smallest keyed 64-bit hashes of its distinct rows (a
bottom-k MinHash sketch, Broder 1997 "On the resemblance and containment of documents"; Cohen & Kaplan 2007
"Summarizing data using bottom-k sketches"). For two sketches, the hashes at or below the smaller of their k-th values
are a uniform sample of each set under one hash threshold, so the share of the sample of A found in B estimates the
containment |A ∩ B| / |A| (standard error about sqrt(c(1 − c) / k)).

The hash is keyed (a key derived from the registry's key) so a sketch is of no use without the registry; like the
fingerprints, sketches stay in the registry's database, which only the data's owner reads.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

K = 1024  # hashes kept per version: 8 KiB; containment to about ±0.016 (one standard error at c = 0.5)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 that spreads every input bit (Steele et al. 2014)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def keyed_hashes(digests: np.ndarray, key: bytes) -> np.ndarray:
    """A keyed 64-bit hash of each row digest, shape (n,): two rounds of a bijective mix around key words."""
    words = hmac.new(key, b"lightning-dp/sketch/v1", hashlib.sha256).digest()
    k1, k2 = (np.uint64(int.from_bytes(words[i:i + 8], "little")) for i in (0, 8))
    return _mix(_mix(np.asarray(digests, dtype=np.uint64) ^ k1) ^ k2)


def bottom_k(hashes: np.ndarray, k: int = K) -> np.ndarray:
    """The ``k`` smallest distinct hashes, ascending, shape (min(k, distinct),)."""
    hashes = np.asarray(hashes, dtype=np.uint64)
    if len(hashes) > 4 * k:  # only the smallest matter: partition first (O(n)), then sort the few
        hashes = np.partition(hashes, 4 * k)[: 4 * k + 1]
    return np.unique(hashes)[:k]


def containment(a: np.ndarray, b: np.ndarray, k: int = K) -> tuple[float, float]:
    """Estimated |A ∩ B| / |A| and |A ∩ B| / |B| from the two bottom-k sketches (each ascending, as from :func:`bottom_k`).

    A sketch shorter than ``k`` holds its whole set; otherwise only hashes up to its k-th are known, so both are
    compared below the smaller of those thresholds.
    """
    if len(a) == 0 or len(b) == 0:
        return 0.0, 0.0
    tau = min(a[-1] if len(a) >= k else np.uint64(2**64 - 1), b[-1] if len(b) >= k else np.uint64(2**64 - 1))
    sa, sb = a[a <= tau], b[b <= tau]
    both = len(np.intersect1d(sa, sb, assume_unique=True))
    return both / max(len(sa), 1), both / max(len(sb), 1)


def encode(sketch: np.ndarray) -> bytes:
    return np.asarray(sketch, dtype="<u8").tobytes()


def decode(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<u8").astype(np.uint64)
