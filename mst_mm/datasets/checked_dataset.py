"""Image datasets whose problems surface at start-up, or are skipped within a budget."""
import os.path as osp
from typing import List, Optional

import mmcv
from mmcv.transforms import LoadImageFromFile
from mmengine import fileio
from mmengine.logging import MMLogger, print_log
from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS, TRANSFORMS

from .folder_scan import scan_image_folder, why_not_a_file
from .image_format import (
    format_from_extension,
    image_problem,
    sniff_image_format,
    undecodable_reason,
)

__all__ = ['CheckedImageDataset', 'LoadImageOrSkip', 'OWN_DATA_HINT',
           'image_problem']

#: Appended to the layout errors of the datasets that expect one fixed layout.
OWN_DATA_HINT = ("For a folder of your own images (flat, with class sub-folders, or in "
                 "ImageNet's layout) use type='PretrainImageFolder', which finds the layout "
                 'from data_root (the pretraining configs use it; see docs/own_data.md).')


@TRANSFORMS.register_module()
class LoadImageOrSkip(LoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` that turns an unusable image into a warning with the
    true reason and a ``None`` sample, which the dataset replaces. The format is judged
    from the content, not the extension. See docs/reliability.md.

    Args:
        *args, **kwargs: ``LoadImageFromFile``'s arguments.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._warned_extension = False

    def transform(self, results: dict) -> Optional[dict]:
        """Load ``results['img_path']``, or warn and return None."""
        filename = results['img_path']
        try:
            problem = self._not_a_file(filename)
            if problem is None:
                img_bytes = fileio.get(filename, backend_args=self.backend_args)
                problem = image_problem(img_bytes)
            if problem is None:
                img = self._decode(img_bytes)
                problem = undecodable_reason(img_bytes) if img is None else None
        except Exception as error:  # unreadable file: I/O error, vanished, permission
            problem = f'{type(error).__name__}: {error}'
        if problem:
            print_log(f'Skipping {filename}: {problem}.', logger='current', level=30)
            return None
        self._check_extension(filename, img_bytes)
        if self.to_float32:
            img = img.astype('float32')
        results.update(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2])
        return results

    def _not_a_file(self, filename: str) -> Optional[str]:
        # A FIFO would block the reader; a backend may map the path elsewhere: local only.
        if self.backend_args is not None or '://' in filename:
            return None
        return why_not_a_file(filename)

    def _decode(self, img_bytes: bytes):
        try:
            return mmcv.imfrombytes(img_bytes, flag=self.color_type,
                                    backend=self.imdecode_backend)
        except Exception:  # some decoders raise where OpenCV returns None; same meaning
            return None

    def _check_extension(self, filename: str, img_bytes: bytes) -> None:
        if self._warned_extension:
            return
        claimed, actual = format_from_extension(filename), sniff_image_format(img_bytes)
        if claimed and actual and claimed != actual:
            self._warned_extension = True
            print_log(f'{filename} holds a {actual} image although its extension says '
                      f'{claimed}: loaded it by its content. Files whose extension does not '
                      'match their content are loaded the same way without further '
                      'warnings (this is said once per loader process).',
                      logger='current', level=30)


class _CheckedInputs:
    """Start-up checks and a broken-image budget for mmpretrain's ``CustomDataset`` family.
    See docs/reliability.md (What happens with broken data).

    Args:
        max_corrupt_images (int): Broken images tolerated per loader process.
            Defaults to 100.
        check_files (bool): Check that every image an annotation file names exists.
            Defaults to True.
        **kwargs: ``CustomDataset``'s arguments.
    """

    #: What the dataset expects under ``data_root``, for its error messages.
    EXPECTED_LAYOUT = 'images under data_root'

    def __init__(self, *args, max_corrupt_images: int = 100, check_files: bool = True,
                 **kwargs) -> None:
        if max_corrupt_images < 0:
            raise ValueError(f'max_corrupt_images must be >= 0, got {max_corrupt_images}.')
        self.max_corrupt_images = max_corrupt_images
        self.check_files = check_files
        self.corrupt_images: List[str] = []
        self._check_root(kwargs.get('data_root', args[0] if args else ''))
        super().__init__(*args, **kwargs)

    def _layout_help(self) -> str:
        """What this dataset expects, and where to go for other layouts."""
        return f'{type(self).__name__} expects {self.EXPECTED_LAYOUT}. {OWN_DATA_HINT}'

    def _check_root(self, root: str) -> None:
        if root and '://' not in root and not osp.isdir(root):
            raise FileNotFoundError(
                f'data_root {root!r} does not exist (or is not a folder). '
                f'{self._layout_help()}\nSet it with --cfg-options '
                'train_dataloader.dataset.data_root=PATH.')

    def load_data_list(self) -> List[dict]:
        try:
            data_list = super().load_data_list()
        except RuntimeError as error:  # mmpretrain's "Found 0 files in subfolders of ..."
            raise RuntimeError(f'No images in {self.data_prefix["img_path"]!r}: {error}. '
                               f'{self._layout_help()}') from error
        if not data_list:
            raise RuntimeError(f'The dataset at {self.data_root!r} (ann_file '
                               f'{self.ann_file!r}) lists no images. {self._layout_help()}')
        if self.ann_file and self.check_files:
            missing = [d['img_path'] for d in data_list if not osp.isfile(d['img_path'])]
            if missing:
                examples = ', '.join(f'{path} ({why_not_a_file(path)})' for path in missing[:3])
                raise FileNotFoundError(
                    f'{len(missing)} of the {len(data_list)} images that {self.ann_file!r} '
                    f'names do not exist or are not files, e.g. {examples}. Fix the file or '
                    'data_root (or set check_files=False to skip this check).')
        return data_list

    def _find_samples(self) -> list:
        """mmpretrain's folder listing, made safe against symlink loops and odd entries."""
        root = self.img_prefix
        if '://' in root:  # a remote backend: mmpretrain lists it
            return super()._find_samples()
        if not osp.isdir(root):  # e.g. ImageNet's <data_root>/train for a class folder
            raise FileNotFoundError(f'The image folder {root!r} does not exist. '
                                    f'{self._layout_help()}')
        classes, samples, empty_classes, ignored = scan_image_folder(
            root, self.is_valid_file, with_label=self.with_label)
        if ignored.summary():
            print_log(ignored.summary(), logger='current', level=30)
        if self.with_label:
            self.folder_to_idx = {name: i for i, name in enumerate(classes)}
            if self.CLASSES is not None and len(self.CLASSES) != len(classes):
                raise ValueError(
                    f"The number of subfolders ({len(classes)}) doesn't match the number "
                    f'of specified classes ({len(self.CLASSES)}) in {root!r}. '
                    f'{self._layout_help()}')
            if self.CLASSES is None:
                self._metainfo['classes'] = tuple(classes)
        else:
            samples = [path for path, _ in samples]
        if not samples:
            # load_data_list turns mmpretrain's message into one that says what to do
            raise RuntimeError(f'Found 0 files in subfolders of: {self.data_prefix}. '
                               f'Supported extensions are: {",".join(self.extensions)}')
        if empty_classes:
            MMLogger.get_current_instance().warning(
                f'Found no valid file in the folder {", ".join(sorted(empty_classes))}. '
                f'Supported extensions are: {", ".join(self.extensions)}')
        return samples

    def prepare_data(self, idx: int):
        data = super().prepare_data(idx)
        path = None if data is not None else self.get_data_info(idx)['img_path']
        if path is not None and path not in self.corrupt_images:  # LoadImageOrSkip warned
            self.corrupt_images.append(path)
            if len(self.corrupt_images) > self.max_corrupt_images:
                raise RuntimeError(
                    f'{len(self.corrupt_images)} broken images, more than '
                    f'max_corrupt_images={self.max_corrupt_images}; the last ones: '
                    f'{self.corrupt_images[-3:]}. Replace or remove them, or raise '
                    'train_dataloader.dataset.max_corrupt_images.')
        return data


@DATASETS.register_module()
class CheckedImageDataset(_CheckedInputs, CustomDataset):
    """mmpretrain's ``CustomDataset``, checked at start-up and tolerant of a few broken
    images; extra arguments ``max_corrupt_images`` and ``check_files`` (``_CheckedInputs``)."""

    EXPECTED_LAYOUT = ('<data_root>/<class>/<image> (one sub-folder per class; with '
                       'with_label=False, every image under data_root), or an ann_file of '
                       "'<path> <label>' lines relative to data_root/data_prefix")
