"""An input pipeline read in bursts, as training reads it (steps, then a pause for a checkpoint
or an evaluation), keeps its memory flat: tf.data's autotuning no longer grows buffers and
parallelism while the iterator waits (pmi_jax.tasks.bounded_options)."""
import os
import time

import numpy as np
import pytest

from pmi_jax import tasks
from tests.prepared_data import write_prepared_corpus

CYCLES = 6
BURST_S = IDLE_S = 1.0
# Measured on a loaded 2-core machine, MiB of RSS gained from the end of the first cycle to the
# end of the sixth: 40-44 with the bounded options, 96 with tf.data's defaults (autotuning
# under a RAM budget of half the host, and its prefetch buffers); the bound sits between.
TOLERANCE_MIB = 64


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("bursts"))
    write_prepared_corpus(data_dir, sequences={"train": 1500}, shards={"train": 4}, seq_len=256, seed=5)
    return data_dir


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_rss_stays_flat_over_bursts_and_pauses(corpus_dir):
    ds = tasks.get_dataset(corpus_dir, "pmi", "train", batch_size=64, seed=0, shuffle_buffer_size=256)
    batches = ds.as_numpy_iterator()
    rss, read = [], 0
    for _ in range(CYCLES):
        end = time.monotonic() + BURST_S
        while time.monotonic() < end:
            next(batches)
            read += 1
        time.sleep(IDLE_S)
        rss.append(_rss_mib())
    growth = rss[-1] - rss[0]
    assert read > CYCLES, "the bursts read almost nothing: the test measured no pipeline work"
    assert growth < TOLERANCE_MIB, f"RSS per cycle (MiB): {np.round(rss).tolist()}"
