"""A pretraining dataset for any folder of images: flat, with class sub-folders, or ImageNet's.
See docs/own_data.md."""
import inspect
import os
import os.path as osp

from mmengine.logging import print_log
from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS

from .checked_dataset import OWN_DATA_HINT, _CheckedInputs

#: mmpretrain's ``CustomDataset`` default image extensions (its ``__init__`` default).
IMAGE_EXTENSIONS = tuple(
    inspect.signature(CustomDataset.__init__).parameters['extensions'].default)

#: The layouts :class:`PretrainImageFolder` reads, as its messages describe them.
LAYOUTS = {
    'flat': '<data_root>/**/<image>: every image under data_root, at any depth, no labels',
    'class_folders': '<data_root>/<class>/**/<image>: one sub-folder per class, labels are '
                     'the sub-folder names (not needed for pretraining)',
    'imagenet': "ImageNet's: <data_root>/<split>/ holds the images (class sub-folders or "
                'any images), optionally listed with labels by <data_root>/meta/<split>.txt',
}


def describe_layouts() -> str:
    """The layouts :class:`PretrainImageFolder` accepts, one per line, for error messages."""
    return '\n'.join(f"  data_layout='{name}': {text}" for name, text in LAYOUTS.items())


def _top_level(folder: str, extensions: tuple) -> tuple:
    """``(image files, sub-folders)`` directly in ``folder``; hidden entries left out."""
    images, folders = [], []
    for entry in os.scandir(folder):
        if entry.name.startswith('.'):
            continue
        try:
            if entry.is_dir():
                folders.append(entry.name)
            elif entry.is_file() and entry.name.lower().endswith(extensions):
                images.append(entry.name)
        except OSError:  # a broken entry decides nothing; the scan reports it later
            continue
    return images, folders


def detect_layout(data_root: str, split: str = 'train',
                  extensions: tuple = IMAGE_EXTENSIONS) -> str:
    """The layout of a local image folder: ``'imagenet'`` if ``<data_root>/<split>/`` is a
    folder, else ``'flat'`` if it holds images, else ``'class_folders'`` (docs/own_data.md).

    Raises:
        RuntimeError: ``data_root`` holds neither images nor sub-folders.
    """
    if osp.isdir(osp.join(data_root, split)):
        return 'imagenet'
    images, folders = _top_level(data_root, tuple(e.lower() for e in extensions))
    if images:
        return 'flat'
    if folders:
        return 'class_folders'
    raise RuntimeError(
        f'data_root {data_root!r} holds no images ({", ".join(extensions)}) and no '
        f'sub-folders. PretrainImageFolder reads these layouts:\n{describe_layouts()}\n'
        'Point data_root at the folder that holds your images.')


@DATASETS.register_module()
class PretrainImageFolder(_CheckedInputs, CustomDataset):
    """Every image of a folder, flat, in class folders or in ImageNet's layout, for
    pretraining: a ``CustomDataset`` whose layout arguments follow from ``data_root``, with
    :class:`CheckedImageDataset`'s checks. See docs/own_data.md.

    Args:
        data_root (str): The image folder.
        data_layout (str): ``'auto'`` (:func:`detect_layout`), ``'flat'``,
            ``'class_folders'`` or ``'imagenet'``. Defaults to 'auto'.
        split (str): Split folder and annotation file of the ImageNet layout. Defaults to 'train'.
        **kwargs: ``CustomDataset``'s other arguments, ``max_corrupt_images``, ``check_files``.
    """

    EXPECTED_LAYOUT = ('one of these layouts (found from data_root with '
                       f"data_layout='auto'):\n{describe_layouts()}")

    def __init__(self, data_root: str, data_layout: str = 'auto', split: str = 'train',
                 **kwargs) -> None:
        fixed = sorted(set(kwargs) & {'data_prefix', 'ann_file', 'with_label'})
        if fixed:
            raise ValueError(
                f'PretrainImageFolder sets {", ".join(fixed)} from data_root and data_layout. '
                "Drop them, or use type='CheckedImageDataset' to give them yourself.")
        if data_layout != 'auto' and data_layout not in LAYOUTS:
            raise ValueError(f"data_layout must be 'auto' or one of {sorted(LAYOUTS)}, got "
                             f'{data_layout!r}. The layouts:\n{describe_layouts()}')
        self._check_root(data_root)
        extensions = tuple(kwargs.get('extensions', IMAGE_EXTENSIONS))
        if data_layout == 'auto':
            if '://' in data_root:
                raise ValueError(f"data_layout='auto' lists local folders only; for "
                                 f'{data_root!r} set data_layout to one of {sorted(LAYOUTS)}.')
            data_layout = detect_layout(data_root, split, extensions)
            self.layout_source = 'found'
        else:
            self.layout_source = 'given'
        self.data_layout = data_layout
        self.split = split
        data_prefix, ann_file, with_label = self._arguments_of(data_root, split, extensions)
        super().__init__(data_root=data_root, data_prefix=data_prefix, ann_file=ann_file,
                         with_label=with_label, **kwargs)
        if self._fully_initialized:
            self._log_layout()

    def _arguments_of(self, data_root: str, split: str, extensions: tuple) -> tuple:
        """``(data_prefix, ann_file, with_label)`` of ``CustomDataset`` for the layout."""
        if self.data_layout == 'flat':
            return '', '', False
        if self.data_layout == 'class_folders':
            return '', '', True
        split_dir = osp.join(data_root, split)
        ann_file = osp.join('meta', f'{split}.txt')
        if '://' in data_root or osp.isfile(osp.join(data_root, ann_file)):
            return split, ann_file, True
        if not osp.isdir(split_dir):
            raise FileNotFoundError(
                f"data_layout='imagenet' reads the images from {split_dir!r}, which does not "
                f'exist. Expected {LAYOUTS["imagenet"]}. For a folder without a {split!r} '
                "sub-folder use data_layout='auto' (or 'flat' / 'class_folders').")
        images, _ = _top_level(split_dir, tuple(e.lower() for e in extensions))
        return split, '', not images

    def _layout_help(self) -> str:
        layout = getattr(self, 'data_layout', None)
        if layout is None:  # before the layout is known: all of them
            return f'PretrainImageFolder reads {self.EXPECTED_LAYOUT}.'
        return (f"PretrainImageFolder read {self.data_root!r} as data_layout='{layout}' "
                f'({self.layout_source}), which expects {LAYOUTS[layout]}. All layouts:\n'
                f'{describe_layouts()}\nSet train_dataloader.dataset.data_layout to choose '
                'one, or fix data_root.')

    def _log_layout(self) -> None:
        labels = (f'{len(self.CLASSES)} classes' if self.with_label and self.CLASSES
                  else 'labels from ' + self.ann_file if self.ann_file else 'no labels')
        print_log(f'PretrainImageFolder: {len(self)} images in {self.img_prefix!r}, '
                  f"{self.layout_source} data_layout='{self.data_layout}' ({labels}).",
                  logger='current')

    def __repr__(self) -> str:
        return super().__repr__() + f'\n    Data layout: \t{self.data_layout}'


__all__ = ['LAYOUTS', 'OWN_DATA_HINT', 'PretrainImageFolder', 'describe_layouts',
           'detect_layout']
