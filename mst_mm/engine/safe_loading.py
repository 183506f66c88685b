"""The one checkpoint reader: a file from anywhere loads as weights, never as code.

1. The archive is checked before any loader opens it: a torch zip (``torch.save``'s format
   since 1.6) whose entries are stored uncompressed, as ``torch.save`` writes them, so that
   no entry inflates beyond the file; a pickle of at most :data:`MAX_PICKLE_BYTES`; no tuple
   nested deeper than ``MAX_DEPTH``.
2. torch's own weights-only loader reads it, with nothing added to its allow-list. Every
   checkpoint this project writes loads here (``plain_checkpoint``).
3. A file that loader refuses is read by :mod:`~mst_mm.engine.foreign_pickle`, which turns
   the classes of mmengine, mmpretrain and DINO checkpoints into plain data and refuses
   everything else, naming it.

Nothing is allowed process-wide, so concurrent loads in other threads are unaffected. The
threat model and the bounds: docs/reliability.md.
"""
import hashlib
import os
import os.path as osp
import pickle
import re
import shutil
import tempfile
import urllib.request
import zipfile
from typing import Any, Optional, Union

import torch
from mmengine.dist import get_dist_info

from mst_mm.errors import CheckpointError

from .foreign_pickle import ForeignPickleError, check_structure, read_foreign_pickle
from .plain_checkpoint import from_plain

__all__ = ['MAX_PICKLE_BYTES', 'download_checkpoint', 'read_checkpoint']

#: The largest ``data.pkl`` read (a training checkpoint's is well under 1 MiB).
MAX_PICKLE_BYTES = 64 << 20
#: Seconds a download may wait for the server at a time.
DOWNLOAD_TIMEOUT = 60
_RETRY = 'Use another checkpoint (an earlier epoch_N.pth or a fresh copy).'
# torch's legacy format starts with a pickled magic number (LONG1 0x1950a86a20f9469cfc6c).
_LEGACY_MAGIC = b'\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19'


def read_checkpoint(filename: str, map_location: Union[None, str, torch.device] = None,
                    mmap: bool = False) -> Any:
    """What ``filename`` (a path, or an ``http(s)://`` URL downloaded once) holds, read
    weights-only as described above, with the plain forms of numpy values and mmengine's
    ``HistoryBuffer`` built again.

    Raises:
        CheckpointError: the file is missing, broken, not a torch zip checkpoint, beyond the
            bounds, or asks for anything but weights and plain data; the message names it.
    """
    if filename.startswith(('http://', 'https://')):
        url, filename = filename, download_checkpoint(filename)
        try:
            return read_checkpoint(filename, map_location, mmap)
        except CheckpointError as error:
            raise CheckpointError(f'{url}: {error} Delete {filename} to download it '
                                  'again.') from None
    if '://' in filename:
        raise CheckpointError(f'Cannot read {filename}: only local files and http(s):// URLs '
                              'are read weights-only. Download it and give the local path.')
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise CheckpointError(f'Checkpoint {filename} does not exist.')
    with _open_archive(filename) as (archive, pickle_name):
        data = archive.read(pickle_name)
        try:
            check_structure(data)
        except CheckpointError as error:
            raise CheckpointError(f'Refusing to load {filename}: {error}.') from None
        try:
            loaded = torch.load(filename, map_location=map_location, weights_only=True,
                                mmap=mmap)
        except pickle.UnpicklingError:  # torch's allow-list refuses it: a foreign file
            device = None if map_location is None else torch.device(map_location)
            try:
                loaded = read_foreign_pickle(archive, pickle_name, data, device)
            except ForeignPickleError as error:
                raise CheckpointError(
                    f'Refusing to load {filename}: its pickle asks for {error.what}, which '
                    'no checkpoint of weights holds. Loading it could run code hidden in '
                    'the file: use a checkpoint you trust.') from None
            except Exception as error:  # torch refused a tensor our bounds allowed, say
                raise _corrupted(filename, error) from None
        except Exception as error:  # torch reads what zipfile accepted, and disagrees
            raise _corrupted(filename, error) from None
    return from_plain(loaded, filename)


def _corrupted(filename: str, error: Exception) -> CheckpointError:
    return CheckpointError(f'Cannot read checkpoint {filename}: it is corrupted '
                           f'({type(error).__name__}: {str(error)[:200]}). {_RETRY}')


class _open_archive:
    """``(ZipFile, name of its data.pkl)`` of a checked torch zip checkpoint."""

    def __init__(self, filename: str) -> None:
        self.filename = filename

    def __enter__(self):
        filename, size = self.filename, osp.getsize(self.filename)
        with open(filename, 'rb') as f:
            head = f.read(len(_LEGACY_MAGIC))
        if not zipfile.is_zipfile(filename):
            why = ('the file is empty (0 bytes)' if size == 0 else
                   f'the file is truncated ({size} bytes, the end of its zip archive is '
                   'missing): the save that wrote it was probably interrupted'
                   if head.startswith(b'PK\x03\x04') else
                   "it is in torch's legacy format (before 1.6), which only an unrestricted "
                   'unpickler reads. If you trust it, convert it once: python -c "import '
                   f"torch; torch.save(torch.load('{filename}', weights_only=False), "
                   f"'{filename}.zip.pth')\" and load the copy"
                   if head == _LEGACY_MAGIC else
                   f'it is not a PyTorch checkpoint (torch.save\'s zip format), or it is '
                   f'corrupted ({size} bytes)')
            raise CheckpointError(f'Cannot read checkpoint {filename}: {why}. '
                                  + ('' if head == _LEGACY_MAGIC else _RETRY))
        try:
            self.archive = zipfile.ZipFile(filename)
            entries = self.archive.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as error:
            raise CheckpointError(f'Cannot read checkpoint {filename}: its zip archive is '
                                  f'corrupted ({error}). {_RETRY}') from None
        pickles = [e for e in entries if re.fullmatch(r'[^/]+/data\.pkl', e.filename)]
        problem = (
            'it holds no data.pkl at its top level' if len(pickles) != 1 else
            'it compresses its entries, which torch.save never does'
            if any(e.compress_type != zipfile.ZIP_STORED for e in entries) else
            'its entries claim more bytes than the file has'
            if sum(e.file_size for e in entries) > size else
            f'its pickle is {pickles[0].file_size} bytes, more than the {MAX_PICKLE_BYTES} '
            'that any checkpoint needs' if pickles[0].file_size > MAX_PICKLE_BYTES else None)
        if problem:
            self.archive.close()
            raise CheckpointError(f'Refusing to load {filename}: {problem}: it was not written '
                                  f'by torch.save. {_RETRY}')
        return self.archive, pickles[0].filename

    def __exit__(self, *exc_info) -> None:
        self.archive.close()


def download_checkpoint(url: str, cache_dir: Optional[str] = None) -> str:
    """The local copy of ``url`` in ``cache_dir`` (torch's hub cache, ``TORCH_HOME``, by
    default), downloaded once under a name made of a hash of the whole URL; in a distributed
    run rank 0 downloads while the others wait."""
    cache_dir = cache_dir or osp.join(torch.hub.get_dir(), 'checkpoints')
    name = re.sub(r'[^\w.-]', '_', osp.basename(url.split('?')[0])) or 'checkpoint.pth'
    cached = osp.join(cache_dir, f'{hashlib.sha256(url.encode()).hexdigest()[:24]}-{name}')
    rank, world_size = get_dist_info()
    if rank == 0 and not osp.isfile(cached):
        os.makedirs(cache_dir, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=cache_dir, prefix='.download-')
        try:
            with os.fdopen(handle, 'wb') as out, \
                    urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response:
                shutil.copyfileobj(response, out)
            os.replace(partial, cached)
        except Exception as error:  # network, HTTP status, disk: the user's fix is the same
            os.remove(partial)
            raise CheckpointError(f'Cannot download {url} ({type(error).__name__}: {error}). '
                                  'Check the URL and the network, or download the file '
                                  'yourself and give its local path.') from None
    if world_size > 1:
        torch.distributed.barrier()
    return cached
