"""`large_array_malloc` changes glibc's thresholds inside its block only, and the build never does.

Observed through glibc itself: an allocation of 40 MiB (above the 32 MiB the default mmap
threshold can ever slide up to, below the block's 64 MiB) is a fresh mmap outside the block and
comes from the heap inside it; `mallinfo2().hblks` counts the mmapped chunks.
"""
import ctypes

import pytest

from pmi_jax.preprocess.vocab.malloc_thresholds import large_array_malloc

_SIZE = 40 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc():
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("needs glibc 2.33 or later (mallinfo2)")
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def _is_mmapped(libc) -> bool:
    """Whether glibc serves a 40 MiB allocation with an mmap of its own."""
    before = libc.mallinfo2().hblks
    pointer = libc.malloc(_SIZE)
    assert pointer
    try:
        return libc.mallinfo2().hblks == before + 1
    finally:
        libc.free(pointer)


def test_thresholds_are_raised_inside_the_block_and_restored_after_it():
    libc = _libc()
    assert _is_mmapped(libc)
    with large_array_malloc():
        assert not _is_mmapped(libc)
        with large_array_malloc():
            assert not _is_mmapped(libc)
        assert not _is_mmapped(libc)  # the inner block restores the outer one's values
    assert _is_mmapped(libc)


def test_thresholds_are_restored_when_the_block_raises():
    libc = _libc()
    with pytest.raises(KeyError):
        with large_array_malloc():
            raise KeyError
    assert _is_mmapped(libc)


def test_building_a_vocabulary_leaves_the_thresholds_alone(tmp_path):
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions, build_vocabulary

    libc = _libc()
    (tmp_path / "c.txt").write_text("new york city is big\n\nnew york is a city\n\nnew york city\n")
    build_vocabulary([str(tmp_path / "c.txt")], str(tmp_path / "v"), VocabOptions(size=4, min_count=2, workers=1))
    assert _is_mmapped(libc)
