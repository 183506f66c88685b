"""The evidence data, rendered from ``animal-shape-mnist`` silhouettes (docs/evidence.md, Data):
object images with their masks and COCO/mmseg scenes; also the photo crops that the loader
benchmark reads (:func:`write_photo_crops`), and class folders read into memory at once."""
import gzip
import importlib.util
import json
import os
import os.path as osp
import pickle
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from skimage import data as skimage_data
from skimage.util import img_as_ubyte

CLASSES = ('bear', 'bird', 'cat', 'cow', 'dog', 'elephant', 'giraffe', 'horse', 'sheep',
           'zebra')
PACKAGE = 'animal_shape_mnist'
DATA_FILES = ('animal_data_version_3.gz', 'animal_label_version_3.gz')
# Bump when the rendering changes, so that written folders are rewritten, not reused.
RENDER_VERSION = 1

# Grey levels in [0, 1]: background mean and noise, object mean and noise.
BACKGROUND_LEVEL, BACKGROUND_NOISE, BACKGROUND_SMOOTHING = 0.35, 0.16, 1.5
OBJECT_LEVEL, OBJECT_NOISE = 0.78, 0.06


def load_silhouettes(package_dir: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The (10000, 28, 28) uint8 silhouettes and their (10000,) class indices, from the
    installed package (or a folder laid out as it is)."""
    if package_dir is None:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(
                f'{PACKAGE} is not installed: pip install animal-shape-mnist==0.39 '
                '(requirements/runtime.txt pins it; tools/setup_env.sh installs it).')
        package_dir = list(spec.submodule_search_locations)[0]
    data_path, label_path = (osp.join(package_dir, 'data', 'Animal Shape', name)
                             for name in DATA_FILES)
    missing = [p for p in (data_path, label_path) if not osp.isfile(p)]
    if missing:
        raise FileNotFoundError(f'{PACKAGE} is installed but lacks {missing}: reinstall it '
                                '(pip install --force-reinstall animal-shape-mnist==0.39).')
    with gzip.open(data_path, 'rb') as f:
        images = np.asarray(pickle.load(f), dtype=np.uint8)
    with gzip.open(label_path, 'rb') as f:
        labels = np.asarray(pickle.load(f), dtype=np.int64)
    if images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise ValueError(f'Unexpected silhouette arrays {images.shape} / {labels.shape}.')
    return images, labels


def stratified_split(labels: np.ndarray, test_per_class: int = 200,
                     seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Sorted indices of (train, test), ``test_per_class`` of every class held out."""
    # RandomState draws the same numbers on every machine and numpy version.
    rng = np.random.RandomState(seed)
    test: List[int] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) <= test_per_class:
            raise ValueError(f'Class {c} has {len(idx)} images; cannot hold out '
                             f'{test_per_class}.')
        test += rng.choice(idx, test_per_class, replace=False).tolist()
    test_idx = np.sort(np.array(test, dtype=np.int64))
    return np.setdiff1d(np.arange(len(labels)), test_idx), test_idx


# Recipes are chosen on a validation split carved from the training images, so that the
# test images reported in the tables are never looked at while choosing.
VAL_PER_CLASS, VAL_SEED = 100, 1


def validation_split(train_labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sorted indices of (fit, val) within the training images: ``VAL_PER_CLASS`` of every
    class held out for validation, drawn with another seed than the test split's."""
    return stratified_split(np.asarray(train_labels), VAL_PER_CLASS, VAL_SEED)


def _resize_bilinear(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of a 2-D float array (pixel centres aligned)."""
    h, w = img.shape
    ys = np.clip((np.arange(height) + 0.5) * h / height - 0.5, 0, h - 1)
    xs = np.clip((np.arange(width) + 0.5) * w / width - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = img[y0][:, x0] * (1 - wx) + img[y0][:, x1] * wx
    bottom = img[y1][:, x0] * (1 - wx) + img[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def _smooth(noise: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian low-pass (reflect padding), normalised back to unit variance."""
    radius = max(1, int(3 * sigma))
    kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    kernel /= kernel.sum()
    padded = np.pad(noise, radius, mode='reflect')
    rows = np.apply_along_axis(np.convolve, 1, padded, kernel, mode='valid')
    out = np.apply_along_axis(np.convolve, 0, rows, kernel, mode='valid')
    return (out - out.mean()) / (out.std() + 1e-8)


def background(rng: np.random.RandomState, height: int, width: int) -> np.ndarray:
    """A (H, W) float background: low-pass grey noise of fixed mean and contrast."""
    noise = _smooth(rng.randn(height, width), BACKGROUND_SMOOTHING)
    return BACKGROUND_LEVEL + BACKGROUND_NOISE * noise


def object_mask(silhouette: np.ndarray, rng: np.random.RandomState, canvas: int,
                area_share: Tuple[float, float]) -> np.ndarray:
    """The silhouette's (h, w) bool mask, box-tight, randomly flipped and scaled to cover a
    random ``area_share`` of a ``canvas`` x ``canvas`` image."""
    alpha = silhouette.astype(np.float64) / 255.
    ys, xs = np.nonzero(alpha >= 0.5)
    if len(ys) == 0:
        raise ValueError('Empty silhouette.')
    alpha = alpha[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    if rng.rand() < 0.5:
        alpha = alpha[:, ::-1]
    share = rng.uniform(*area_share)
    scale = np.sqrt(share * canvas * canvas / (alpha >= 0.5).sum())
    scale = min(scale, canvas / max(alpha.shape))
    h = max(1, min(canvas, int(round(alpha.shape[0] * scale))))
    w = max(1, min(canvas, int(round(alpha.shape[1] * scale))))
    mask = _resize_bilinear(alpha, h, w) >= 0.5
    ys, xs = np.nonzero(mask)
    return mask[ys.min():ys.max() + 1, xs.min():xs.max() + 1]


def paint(image: np.ndarray, mask: np.ndarray, top: int, left: int,
          rng: np.random.RandomState) -> np.ndarray:
    """Paint an object of box-shaped ``mask`` at (top, left); returns its full-canvas mask."""
    full = np.zeros(image.shape, dtype=bool)
    full[top:top + mask.shape[0], left:left + mask.shape[1]] = mask
    image[full] = OBJECT_LEVEL + OBJECT_NOISE * rng.randn(int(full.sum()))
    return full


def to_uint8_rgb(image: np.ndarray) -> np.ndarray:
    grey = np.clip(np.round(image * 255), 0, 255).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2)


def render_object_image(silhouette: np.ndarray, rng: np.random.RandomState,
                        canvas: int = 32,
                        area_share: Tuple[float, float] = (0.15, 0.5)
                        ) -> Tuple[np.ndarray, np.ndarray]:
    """One animal on a textured background: the (canvas, canvas, 3) uint8 image and bool mask."""
    image = background(rng, canvas, canvas)
    mask = object_mask(silhouette, rng, canvas, area_share)
    top = rng.randint(0, canvas - mask.shape[0] + 1)
    left = rng.randint(0, canvas - mask.shape[1] + 1)
    full = paint(image, mask, top, left, rng)
    return to_uint8_rgb(image), full


def render_scene(silhouettes: List[np.ndarray], rng: np.random.RandomState, size: int = 64,
                 area_share: Tuple[float, float] = (0.04, 0.12), min_visible: float = 0.75,
                 tries: int = 20) -> Tuple[np.ndarray, List[Optional[np.ndarray]]]:
    """Several animals on one canvas, later ones in front, each keeping ``min_visible``: the
    (size, size, 3) uint8 image and each silhouette's visible bool mask, None where no place
    was found in ``tries`` draws (then it is not painted)."""
    image = background(rng, size, size)
    visible: List[Optional[np.ndarray]] = []
    for silhouette in silhouettes:
        mask = object_mask(silhouette, rng, size, area_share)
        for _ in range(tries):
            top = rng.randint(0, size - mask.shape[0] + 1)
            left = rng.randint(0, size - mask.shape[1] + 1)
            placed = np.zeros((size, size), dtype=bool)
            placed[top:top + mask.shape[0], left:left + mask.shape[1]] = mask
            if all((v & ~placed).sum() >= min_visible * v.sum()
                   for v in visible if v is not None):
                break
        else:
            visible.append(None)
            continue
        for earlier in visible:
            if earlier is not None:
                earlier &= ~placed
        visible.append(paint(image, mask, top, left, rng))
    return to_uint8_rgb(image), visible


def tight_box(mask: np.ndarray) -> List[float]:
    """COCO ``[x, y, w, h]`` of the smallest box that holds every True pixel."""
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1),
            float(ys.max() - ys.min() + 1)]


def _written_with(out: str, settings: dict) -> Optional[dict]:
    """The summary of ``out`` if it was written with these settings, else None."""
    if not osp.isfile(osp.join(out, 'dataset.json')):
        return None
    with open(osp.join(out, 'dataset.json')) as f:
        summary = json.load(f)
    return summary if summary.get('settings') == settings else None


def write_json(path: str, value: dict) -> dict:
    """Write ``value`` to ``path`` at once (a cut run leaves the old file or none); return it."""
    with open(path + '.tmp', 'w') as f:
        json.dump(value, f, indent=2)
    os.replace(path + '.tmp', path)
    return value


def write_object_images(out: str, canvas: int = 32, test_per_class: int = 200,
                        seed: int = 0, package_dir: Optional[str] = None) -> dict:
    """Write ``out/{train,test}/<class>/<index>.png`` and ``out/{train,test}_masks.npz``
    (sorted ``files`` and their bool ``masks``), unless written with the same settings; the
    settings and the image counts, also in ``out/dataset.json``."""
    settings = dict(version=RENDER_VERSION, canvas=canvas, test_per_class=test_per_class,
                    seed=seed, kind='objects')
    if written := _written_with(out, settings):
        return written
    silhouettes, labels = load_silhouettes(package_dir)
    summary = dict(settings=settings, classes=list(CLASSES))
    for split, indices in zip(('train', 'test'), stratified_split(labels, test_per_class, seed)):
        files, masks = [], []
        for index in indices:
            # One generator per silhouette: an image does not depend on which others exist.
            rng = np.random.RandomState([seed, int(index)])
            image, mask = render_object_image(silhouettes[index], rng, canvas)
            rel = osp.join(split, CLASSES[labels[index]], f'{index:05d}.png')
            os.makedirs(osp.dirname(osp.join(out, rel)), exist_ok=True)
            Image.fromarray(image).save(osp.join(out, rel))
            files.append(rel)
            masks.append(mask)
        order = np.argsort(files)
        np.savez_compressed(osp.join(out, f'{split}_masks.npz'),
                            files=np.array(files)[order], masks=np.stack(masks)[order])
        summary[split] = len(files)
    return write_json(osp.join(out, 'dataset.json'), summary)


def load_object_masks(out: str, split: str = 'test') -> Dict[str, np.ndarray]:
    """``{relative path: (canvas, canvas) bool mask}`` written by :func:`write_object_images`."""
    data = np.load(osp.join(out, f'{split}_masks.npz'))
    return dict(zip(data['files'].tolist(), data['masks']))


def write_scenes(out: str, train_scenes: int = 400, val_scenes: int = 100, size: int = 64,
                 max_objects: int = 4, test_per_class: int = 200, seed: int = 0,
                 package_dir: Optional[str] = None) -> dict:
    """Write scenes of 1-``max_objects`` animals: ``out/{train,val}/<id>.png``, COCO
    ``out/annotations/instances_{train,val}.json`` and mmseg ``out/labels/{train,val}/``
    (0 = background). Val scenes use test-split silhouettes only; idempotent."""
    settings = dict(version=RENDER_VERSION, train_scenes=train_scenes, val_scenes=val_scenes,
                    size=size, max_objects=max_objects, test_per_class=test_per_class,
                    seed=seed, kind='scenes')
    if written := _written_with(out, settings):
        return written
    silhouettes, labels = load_silhouettes(package_dir)
    pools = dict(zip(('train', 'val'), stratified_split(labels, test_per_class, seed)))
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(CLASSES)]
    summary = dict(settings=settings, classes=list(CLASSES))
    for split, count in (('train', train_scenes), ('val', val_scenes)):
        rng = np.random.RandomState([seed, 1 if split == 'train' else 2])
        os.makedirs(osp.join(out, split), exist_ok=True)
        os.makedirs(osp.join(out, 'labels', split), exist_ok=True)
        images, annotations = [], []
        for image_id in range(1, count + 1):
            chosen = rng.choice(pools[split], rng.randint(1, max_objects + 1), replace=False)
            image, visible = render_scene([silhouettes[i] for i in chosen], rng, size)
            name = f'{image_id:06d}.png'
            Image.fromarray(image).save(osp.join(out, split, name))
            label_map = np.zeros((size, size), dtype=np.uint8)
            for index, mask in zip(chosen, visible):
                if mask is None:
                    continue
                label_map[mask] = labels[index] + 1
                rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
                annotations.append(dict(
                    id=len(annotations) + 1, image_id=image_id,
                    category_id=int(labels[index]) + 1, bbox=tight_box(mask),
                    area=float(mask.sum()), iscrowd=0, silhouette_index=int(index),
                    segmentation=dict(size=[size, size], counts=rle['counts'].decode())))
            Image.fromarray(label_map).save(osp.join(out, 'labels', split, name))
            images.append(dict(id=image_id, file_name=name, height=size, width=size))
        os.makedirs(osp.join(out, 'annotations'), exist_ok=True)
        with open(osp.join(out, 'annotations', f'instances_{split}.json'), 'w') as f:
            json.dump(dict(images=images, annotations=annotations, categories=categories), f)
        summary[split] = dict(images=count, objects=len(annotations))
    return write_json(osp.join(out, 'dataset.json'), summary)


PHOTOS = ('astronaut', 'camera', 'cat', 'coffee', 'rocket', 'retina', 'hubble_deep_field',
          'immunohistochemistry', 'brick', 'grass', 'gravel', 'moon', 'coins', 'cell')


def write_photo_crops(out: str, num_images: int = 2048, size: int = 256,
                      seed: int = 0, height: Optional[int] = None) -> Dict[str, object]:
    """Write ``num_images`` random crops of the bundled photos (round-robin over
    :data:`PHOTOS`, positions and sizes drawn with ``seed``) to ``out/<i>.jpg``, ``size`` wide
    and ``height`` high (default: square; 500 x 375 is an average ImageNet photo's), unless
    written with the same arguments; the summary, also in ``out/photos.json``."""
    summary = dict(sources=list(PHOTOS), num_images=num_images, size=size, seed=seed)
    if height is not None and height != size:
        summary['height'] = height
    height = height or size
    stamp = osp.join(out, 'photos.json')
    if osp.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == summary:
                return summary
    os.makedirs(out, exist_ok=True)
    photos = []
    for name in PHOTOS:
        img = img_as_ubyte(getattr(skimage_data, name)())
        photos.append(np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img[..., :3])
    rng = np.random.RandomState(seed)
    for i in range(num_images):
        img = photos[i % len(photos)]
        photo_h, photo_w = img.shape[:2]
        # The largest box of the output's aspect ratio, scaled by 0.5-1, placed at random.
        scale = rng.uniform(0.5, 1.0)
        box_h = int(scale * min(photo_h, photo_w * height / size))
        box_w = int(scale * min(photo_w, photo_h * size / height))
        top, left = rng.randint(0, photo_h - box_h + 1), rng.randint(0, photo_w - box_w + 1)
        crop = Image.fromarray(np.ascontiguousarray(img[top:top + box_h, left:left + box_w]))
        crop.resize((size, height), Image.BICUBIC).save(osp.join(out, f'{i:05d}.jpg'),
                                                        quality=90)
    return write_json(stamp, summary)


def class_folder_files(root: str) -> Tuple[List[str], torch.Tensor]:
    """``root/<class>/*`` as relative paths and labels, in mmpretrain's ``CustomDataset``
    order (sorted classes, sorted files), so that dataset indices address the same images."""
    if not osp.isdir(root):
        raise FileNotFoundError(f'No image folder {root}: write it first (python '
                                'projects/mst_research/tools/write_animal_shapes.py '
                                'data/animal_shapes).')
    classes = sorted(d for d in os.listdir(root) if osp.isdir(osp.join(root, d)))
    paths, labels = [], []
    for label, cls in enumerate(classes):
        names = sorted(os.listdir(osp.join(root, cls)))
        paths += [f'{cls}/{name}' for name in names]
        labels += [label] * len(names)
    if not paths:
        raise FileNotFoundError(f'No images under {root}/<class>/.')
    return paths, torch.tensor(labels)


def load_class_folders(root: str) -> Tuple[np.ndarray, torch.Tensor, List[str]]:
    """``root/<class>/*.png`` as a (N, H, W, 3) uint8 RGB array, labels and relative paths,
    in :func:`class_folder_files` order."""
    paths, labels = class_folder_files(root)
    images = [np.array(Image.open(osp.join(root, p)).convert('RGB')) for p in paths]
    return np.stack(images), labels, paths


def image_batches(images: np.ndarray, batch_size: int = 500) -> Iterator[torch.Tensor]:
    """(N, H, W, 3) uint8 images as (B, 3, H, W) tensors."""
    for start in range(0, len(images), batch_size):
        yield torch.from_numpy(images[start:start + batch_size]).permute(0, 3, 1, 2)
