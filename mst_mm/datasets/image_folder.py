"""Image-folder datasets: the layout found from data_root, clear errors, broken-image budget."""
import inspect
import os
import os.path as osp
from typing import List, Optional

from mmengine.logging import print_log
from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS

from ..errors import UserInputError

IMAGE_EXTENSIONS = tuple(  # CustomDataset's default
    inspect.signature(CustomDataset.__init__).parameters['extensions'].default)

LAYOUTS = {  # what PretrainImageFolder reads
    'flat': '<data_root>/**/<image>: every image under data_root, at any depth, no labels',
    'class_folders': '<data_root>/<class>/**/<image>: one sub-folder per class (its label)',
    'imagenet': "ImageNet's: <data_root>/<split>/**/<image>, optionally listed with labels by "
                '<data_root>/meta/<split>.txt',
}
ALL_LAYOUTS = '\n'.join(f"  data_layout='{name}': {text}" for name, text in LAYOUTS.items())


def _holds(folder: str, extensions: tuple) -> tuple:
    """``(holds images, holds sub-folders)`` directly in ``folder``; hidden entries left out."""
    entries = [e for e in os.scandir(folder) if not e.name.startswith('.')]
    extensions = tuple(e.lower() for e in extensions)
    return (any(e.is_file() and e.name.lower().endswith(extensions) for e in entries),
            any(e.is_dir() for e in entries))


def detect_layout(data_root: str, split: str = 'train', extensions=IMAGE_EXTENSIONS) -> str:
    """``'imagenet'`` if ``<data_root>/<split>/`` is a folder, else ``'flat'`` if
    ``data_root`` holds images, else ``'class_folders'`` if it holds sub-folders."""
    if osp.isdir(osp.join(data_root, split)):
        return 'imagenet'
    images, folders = _holds(data_root, extensions)
    if images or folders:
        return 'flat' if images else 'class_folders'
    raise RuntimeError(
        f'data_root {data_root!r} holds no images ({", ".join(extensions)}) and no sub-folders. '
        f'PretrainImageFolder reads these layouts:\n{ALL_LAYOUTS}\nPoint data_root at your images.')


@DATASETS.register_module()
class CheckedImageDataset(CustomDataset):
    """mmpretrain's ``CustomDataset`` with clear start-up errors, a check that the images
    ``ann_file`` names exist (``check_files``) and a budget of broken images skipped per loader
    process (``LoadImageOrSkip`` warns) before the run stops (``max_corrupt_images``)."""

    EXPECTED_LAYOUT = ('<data_root>/<class>/<image> (one sub-folder per class; with '
                       'with_label=False, every image under data_root), or an ann_file of '
                       "'<path> <label>' lines relative to data_root/data_prefix")

    def __init__(self, data_root: str = '', max_corrupt_images: int = 100,
                 check_files: bool = True, **kwargs) -> None:
        self.max_corrupt_images = max_corrupt_images
        self.check_files = check_files
        self.corrupt_images: List[str] = []
        self._check_root(data_root)
        super().__init__(data_root=data_root, **kwargs)

    def _check_root(self, data_root: str) -> None:
        if data_root and '://' not in data_root and not osp.isdir(data_root):
            raise FileNotFoundError(
                f'data_root {data_root!r} does not exist or is a file. {self._layout_help()}'
                '\nSet it with --cfg-options train_dataloader.dataset.data_root=PATH.')

    def _layout_help(self) -> str:
        return (f'{type(self).__name__} expects {self.EXPECTED_LAYOUT}. For your own images in '
                "any layout use type='PretrainImageFolder', which finds it (docs/own_data.md).")

    def load_data_list(self) -> List[dict]:
        try:
            data_list = super().load_data_list()
            problem = None if data_list else f'{self.ann_file!r} lists none'
        except (RuntimeError, FileNotFoundError) as error:  # "Found 0 files in ...", no folder
            data_list, problem = [], str(error)
        if problem:
            raise RuntimeError(f'No images in {self.img_prefix!r}: {problem}. '
                               f'{self._layout_help()}')
        missing = ([d['img_path'] for d in data_list if not osp.isfile(d['img_path'])]
                   if self.ann_file and self.check_files else [])
        if missing:
            raise FileNotFoundError(
                f'{len(missing)} of the {len(data_list)} images in {self.ann_file!r} are missing, '
                f'e.g. {", ".join(missing[:3])}. Fix them, or set check_files=False.')
        return data_list

    def prepare_data(self, idx: int) -> Optional[dict]:
        """The sample, or None (the caller draws another) for a broken image, which counts."""
        data = super().prepare_data(idx)
        path = self.get_data_info(idx)['img_path'] if data is None else None
        if path is not None and path not in self.corrupt_images:
            self.corrupt_images.append(path)
            if len(self.corrupt_images) > self.max_corrupt_images:
                raise RuntimeError(
                    f'{len(self.corrupt_images)} broken images, more than '
                    f'max_corrupt_images={self.max_corrupt_images}; the last ones: '
                    f'{self.corrupt_images[-3:]}. Replace or remove them, or raise '
                    'train_dataloader.dataset.max_corrupt_images.')
        return data


@DATASETS.register_module()
class PretrainImageFolder(CheckedImageDataset):
    """Every image of a folder in one of :data:`LAYOUTS` (``data_layout='auto'``: found by
    :func:`detect_layout`), which sets ``CustomDataset``'s ``data_prefix``, ``ann_file`` and
    ``with_label``; ``split`` is ImageNet's split folder and ``meta/<split>.txt``."""

    def __init__(self, data_root: str, data_layout: str = 'auto', split: str = 'train',
                 **kwargs) -> None:
        fixed = sorted(set(kwargs) & {'data_prefix', 'ann_file', 'with_label'})
        if fixed:
            raise UserInputError(
                f'PretrainImageFolder sets {", ".join(fixed)} from data_root and data_layout. '
                "Drop them, or use type='CheckedImageDataset' to give them yourself.")
        if data_layout not in ('auto', *LAYOUTS):
            raise UserInputError(f"data_layout must be 'auto' or one of {sorted(LAYOUTS)}, "
                                 f'got {data_layout!r}.')
        self.data_layout, self.split = None, split  # no layout yet: errors list them all
        self._check_root(data_root)
        extensions = kwargs.get('extensions', IMAGE_EXTENSIONS)
        self.layout_source = 'found' if data_layout == 'auto' else 'given'
        self.data_layout = (detect_layout(data_root, split, extensions)
                            if data_layout == 'auto' else data_layout)
        super().__init__(data_root=data_root, **self._layout_arguments(data_root, extensions),
                         **kwargs)
        if self._fully_initialized:
            print_log(f'PretrainImageFolder: {len(self)} images in {self.img_prefix!r}, '
                      f"{self.layout_source} data_layout='{self.data_layout}'.", logger='current')

    def _layout_arguments(self, data_root: str, extensions: tuple) -> dict:
        """``CustomDataset``'s ``data_prefix``, ``ann_file`` and ``with_label`` of the layout."""
        if self.data_layout != 'imagenet':
            return dict(data_prefix='', ann_file='', with_label=self.data_layout == 'class_folders')
        ann_file = osp.join('meta', f'{self.split}.txt')
        if '://' in data_root or osp.isfile(osp.join(data_root, ann_file)):
            return dict(data_prefix=self.split, ann_file=ann_file, with_label=True)
        split_dir = osp.join(data_root, self.split)
        if not osp.isdir(split_dir):
            raise FileNotFoundError(
                f"data_layout='imagenet' reads the images from {split_dir!r}, which does not exist."
                " For a folder without it use data_layout='auto' (or 'flat' / 'class_folders').")
        return dict(data_prefix=self.split, ann_file='',
                    with_label=not _holds(split_dir, extensions)[0])

    def _layout_help(self) -> str:
        if self.data_layout is None:
            return f'PretrainImageFolder reads these layouts:\n{ALL_LAYOUTS}'
        return (f"PretrainImageFolder read {self.data_root!r} as data_layout='{self.data_layout}' "
                f'({self.layout_source}), which expects {LAYOUTS[self.data_layout]}. All layouts:'
                f'\n{ALL_LAYOUTS}\nSet train_dataloader.dataset.data_layout, or fix data_root.')
