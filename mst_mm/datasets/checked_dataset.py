"""Image datasets whose problems surface at start-up, or are skipped within a budget."""
import os.path as osp
from typing import List, Optional

import mmcv
from mmcv.transforms import LoadImageFromFile
from mmengine import fileio
from mmengine.logging import print_log
from mmpretrain.datasets import CustomDataset, ImageNet
from mmpretrain.registry import DATASETS, TRANSFORMS

_JPEG_END, _PNG_END = b'\xff\xd9', b'IEND\xaeB`\x82'


def image_problem(img_bytes: bytes, filename: str) -> Optional[str]:
    """Why these bytes are not a whole image, or None.

    OpenCV decodes a truncated JPEG without an error (the missing rows come out grey), so
    truncation is caught from the format's end marker before decoding.
    """
    tail = img_bytes[-64:].rstrip(b'\x00\r\n ')
    ext = osp.splitext(filename)[1].lower()
    if ext in ('.jpg', '.jpeg') and _JPEG_END not in tail:
        return 'truncated JPEG (no end-of-image marker)'
    if ext == '.png' and _PNG_END not in tail:
        return 'truncated PNG (no IEND chunk)'
    return None


@TRANSFORMS.register_module()
class LoadImageOrSkip(LoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` that turns an unreadable, corrupt or truncated image into
    a warning naming the file and a ``None`` sample, which mmengine's dataset replaces by
    another one. :class:`CheckedImageDataset` counts these against its budget.

    Grayscale, RGBA, CMYK and 16-bit images decode to 3-channel 8-bit BGR (``color_type``
    'color', the default), so they train like any other.
    """

    def transform(self, results: dict) -> Optional[dict]:
        filename = results['img_path']
        try:
            img_bytes = fileio.get(filename, backend_args=self.backend_args)
            problem = image_problem(img_bytes, filename)
            img = None if problem else mmcv.imfrombytes(
                img_bytes, flag=self.color_type, backend=self.imdecode_backend)
            if img is None and problem is None:
                problem = 'the decoder could not read it'
        except Exception as error:  # unreadable file: I/O error, vanished, permission
            problem = f'{type(error).__name__}: {error}'
        if problem:
            print_log(f'Skipping {filename}: {problem}.', logger='current', level=30)
            return None
        if self.to_float32:
            img = img.astype('float32')
        results.update(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2])
        return results


class _CheckedInputs:
    """Start-up checks and a broken-image budget for mmpretrain's ``CustomDataset`` family.

    - A missing or empty ``data_root``, and an annotation file that names missing images,
      stop the run at start-up with a message naming the path.
    - A sample whose image cannot be decoded (see :class:`LoadImageOrSkip`) is replaced by
      another one, with a warning naming the file; past ``max_corrupt_images`` distinct
      broken files (in one loader process) the run stops with an error listing what to fix.

    Args:
        max_corrupt_images (int): Broken images tolerated per loader process.
            Defaults to 100.
        check_files (bool): Check that every image an annotation file names exists.
            Defaults to True.
        **kwargs: ``CustomDataset``'s arguments.
    """

    def __init__(self, *args, max_corrupt_images: int = 100, check_files: bool = True,
                 **kwargs) -> None:
        if max_corrupt_images < 0:
            raise ValueError(f'max_corrupt_images must be >= 0, got {max_corrupt_images}.')
        self.max_corrupt_images = max_corrupt_images
        self.check_files = check_files
        self.corrupt_images: List[str] = []
        root = kwargs.get('data_root', args[0] if args else '')
        if root and not osp.isdir(root):
            raise FileNotFoundError(
                f'data_root {root!r} does not exist (or is not a folder). Point '
                'train_dataloader.dataset.data_root at a folder of class sub-folders of '
                'images, e.g. with --cfg-options train_dataloader.dataset.data_root=PATH.')
        super().__init__(*args, **kwargs)

    def load_data_list(self) -> List[dict]:
        try:
            data_list = super().load_data_list()
        except RuntimeError as error:  # mmpretrain's "Found 0 files in subfolders of ..."
            raise RuntimeError(f'No images in {self.data_prefix["img_path"]!r}: {error}. '
                               'Expected <data_root>/<class>/<image>.') from error
        if not data_list:
            raise RuntimeError(f'The dataset at {self.data_root!r} (ann_file '
                               f'{self.ann_file!r}) lists no images.')
        if self.ann_file and self.check_files:
            missing = [d['img_path'] for d in data_list if not osp.isfile(d['img_path'])]
            if missing:
                raise FileNotFoundError(
                    f'{len(missing)} of the {len(data_list)} images that {self.ann_file!r} '
                    f'names do not exist, e.g. {missing[:3]}. Fix the file or data_root '
                    '(or set check_files=False to skip this check).')
        return data_list

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
    """mmpretrain's ``CustomDataset`` (a folder of class sub-folders, or an annotation
    file), checked at start-up and tolerant of a few broken images (see ``_CheckedInputs``
    for the rules and the two extra arguments, ``max_corrupt_images`` and ``check_files``).
    """


@DATASETS.register_module()
class CheckedImageNet(_CheckedInputs, ImageNet):
    """mmpretrain's ``ImageNet``, checked at start-up and tolerant of a few broken images
    (see ``_CheckedInputs``)."""
