"""mmpretrain's folder listing without its crash on symlink loops, recording what is left out.

mmengine's ``list_dir_or_file`` recurses through a link to a parent folder until ``ELOOP``."""
import errno
import os
import os.path as osp
import stat
from typing import Callable, Dict, List, Optional, Set, Tuple

# Why an entry is left out; the summary lists them in the order first met.
DANGLING = 'dangling symlink (its target does not exist)'
LOOP = 'symlink loop'
UNREADABLE = 'unreadable'
SPECIAL = 'not a regular file'
IMAGE_NAMED_FOLDER = 'folder named like an image (the images inside it, if any, are used)'
OUTSIDE_CLASSES = 'file outside the class folders'
OTHER_EXTENSION = "file extension not in the dataset's `extensions`"


class IgnoredEntries:
    """Entries of a data folder that are not used as images, grouped by reason.

    Args:
        root (str): The folder the paths are relative to.
        max_examples (int): Example paths kept per reason. Defaults to 3.
    """

    def __init__(self, root: str, max_examples: int = 3) -> None:
        self.root = osp.normpath(root)
        self.max_examples = max_examples
        self.counts: Dict[str, int] = {}
        self.examples: Dict[str, List[str]] = {}

    def add(self, reason: str, path: str) -> None:
        """Count ``path`` (relative to ``root``) under ``reason``."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < self.max_examples:
            examples.append(path)

    def __len__(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> Optional[str]:
        """One message with the count, reason and a few example paths of each kind, or None."""
        if not self.counts:
            return None
        parts = []
        for reason, count in self.counts.items():
            examples = ', '.join(self.examples[reason])
            more = ', ...' if count > len(self.examples[reason]) else ''
            parts.append(f'{count} x {reason}: {examples}{more}')
        return (f'Ignored {len(self)} entries under {self.root!r} that are not images the '
                f'dataset can use: {"; ".join(parts)}.')


def _special_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, 'FIFO'), (stat.S_ISSOCK, 'socket'),
                       (stat.S_ISCHR, 'character device'), (stat.S_ISBLK, 'block device')):
        if test(mode):
            return name
    return 'special file'


def _os_reason(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return LOOP
    return f'{UNREADABLE} ({error.strerror or type(error).__name__})'


def _classify(entry: os.DirEntry) -> Tuple[str, Optional[str]]:
    """``('dir' | 'file' | 'skip', reason)`` for one entry; links are followed."""
    # DirEntry.is_dir/is_file answer from the listing: no extra system call per image.
    try:
        if entry.is_dir():
            return 'dir', None
        if entry.is_file():
            return 'file', None
        if entry.is_symlink():
            os.stat(entry.path)   # raises for a missing target or a loop
        return 'skip', f'{SPECIAL} ({_special_kind(os.stat(entry.path).st_mode)})'
    except FileNotFoundError:
        return 'skip', DANGLING
    except OSError as error:  # ELOOP for a link to itself, EACCES, EIO, ...
        return 'skip', _os_reason(error)


def why_not_a_file(path: str) -> Optional[str]:
    """Why local ``path`` is not a regular file (links followed), e.g. ``'symlink loop'``;
    None if it is one."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return DANGLING if osp.islink(path) else 'does not exist'
    except OSError as error:
        return _os_reason(error)
    if stat.S_ISREG(mode):
        return None
    return 'a folder' if stat.S_ISDIR(mode) else f'{SPECIAL} ({_special_kind(mode)})'


def _dir_key(path: str) -> Tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _walk_files(folder: str, rel: str, ancestors: Set[Tuple[int, int]],
                is_valid_file: Callable[[str], bool], root_rel: str, found: List[str],
                ignored: IgnoredEntries) -> None:
    """Recursively append ``folder``'s valid files to ``found``; ``root_rel`` prefixes reports."""
    try:
        entries = list(os.scandir(folder))
    except OSError as error:
        ignored.add(_os_reason(error), osp.join(root_rel, rel) + '/')
        return
    for entry in entries:
        child = osp.join(rel, entry.name) if rel else entry.name
        shown = osp.join(root_rel, child)
        kind, reason = _classify(entry)
        if kind == 'dir':
            # Hidden folders are searched too, as mmengine's listing does.
            try:
                key = _dir_key(entry.path)
            except OSError as error:
                ignored.add(_os_reason(error), shown + '/')
                continue
            if key in ancestors:   # a link back to a folder being searched
                ignored.add(LOOP, shown + '/')
                continue
            if is_valid_file(entry.name):
                ignored.add(IMAGE_NAMED_FOLDER, shown + '/')
            _walk_files(entry.path, child, ancestors | {key}, is_valid_file, root_rel,
                        found, ignored)
        elif entry.name.startswith('.'):
            continue   # hidden files (.DS_Store, ._x.jpg) are left out silently, as before
        elif kind == 'file':
            if is_valid_file(child):
                found.append(child)
            else:
                ignored.add(OTHER_EXTENSION, shown)
        else:
            ignored.add(reason, shown)


def scan_image_folder(
        root: str, is_valid_file: Callable[[str], bool], with_label: bool = True
) -> Tuple[List[str], List[Tuple[str, int]], Set[str], IgnoredEntries]:
    """mmpretrain's ``find_folders`` + ``get_samples`` (same result and order on a healthy
    folder), safe against symlink loops, with a record of every entry left out.

    Args:
        root (str): The image folder.
        is_valid_file (Callable[[str], bool]): Accepts a path relative to the class folder
            (or to ``root`` without labels), e.g. by extension.
        with_label (bool): Sub-folders are classes (True) or just folders (False).

    Returns:
        tuple: ``classes`` (empty without labels), ``samples`` (``(path, class_index)``,
        index -1 without labels), ``empty_classes`` and the :class:`IgnoredEntries`.
    """
    ignored = IgnoredEntries(root)
    root_key = _dir_key(root)
    if not with_label:
        found: List[str] = []
        _walk_files(root, '', {root_key}, is_valid_file, '', found, ignored)
        return [], [(path, -1) for path in sorted(found)], set(), ignored

    class_keys = {}
    for entry in os.scandir(root):
        kind, reason = _classify(entry)
        if kind == 'dir':
            try:
                class_keys[entry.name] = _dir_key(entry.path)
            except OSError as error:   # gone or unreadable since the listing: no images
                class_keys[entry.name] = None
                ignored.add(_os_reason(error), entry.name + '/')
            if class_keys[entry.name] == root_key:   # a link back to root is no class
                del class_keys[entry.name]
                ignored.add(LOOP, entry.name + '/')
        elif not entry.name.startswith('.'):
            ignored.add(reason or OUTSIDE_CLASSES, entry.name)
    classes = sorted(class_keys)
    samples: List[Tuple[str, int]] = []
    empty_classes = set()
    for index, name in enumerate(classes):
        found: List[str] = []
        key = class_keys[name]
        if key is not None:
            _walk_files(osp.join(root, name), '', {root_key, key}, is_valid_file, name,
                        found, ignored)
        samples += [(osp.join(name, path), index) for path in sorted(found)]
        if not found:
            empty_classes.add(name)
    return classes, samples, empty_classes, ignored
