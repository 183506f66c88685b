"""Fixtures of the research kit's tests (projects/mst_research/tests)."""
import gzip
import pickle

import numpy as np
import pytest
import torch

from mst_research.data import CLASSES, load_silhouettes


@pytest.fixture(scope='module')
def small_package(tmp_path_factory):
    """A package folder laid out as animal-shape-mnist's, with 4 real silhouettes a class."""
    images, labels = load_silhouettes()
    keep = np.concatenate([np.flatnonzero(labels == c)[:4] for c in range(len(CLASSES))])
    root = tmp_path_factory.mktemp('animal_shape_mnist')
    (root / 'data' / 'Animal Shape').mkdir(parents=True)
    for name, array in (('animal_data_version_3.gz', images[keep]),
                        ('animal_label_version_3.gz', labels[keep])):
        with gzip.open(root / 'data' / 'Animal Shape' / name, 'wb') as f:
            pickle.dump(array, f)
    return str(root)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """A tool's main() run in-process may set torch's thread count (the benchmarks set 1): put
    it back, so that later tests compute as a fresh process does (float sums depend on it)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
