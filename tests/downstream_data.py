"""Tiny COCO-format and Cityscapes-format datasets, laid out as the stock configs expect."""
import json
from pathlib import Path

import numpy as np
from PIL import Image


def _shapes_image(rng: np.random.RandomState, height: int, width: int):
    """A noisy background with two filled rectangles; returns the image and the boxes."""
    img = rng.randint(0, 80, (height, width, 3)).astype(np.uint8)
    boxes = []
    for _ in range(2):
        w, h = rng.randint(width // 5, width // 2), rng.randint(height // 5, height // 2)
        x, y = rng.randint(0, width - w), rng.randint(0, height - h)
        img[y:y + h, x:x + w] = rng.randint(120, 256, 3)
        boxes.append((x, y, w, h))
    return img, boxes


def make_tiny_coco(root, train_images: int = 4, val_images: int = 2,
                   size=(96, 128), seed: int = 0) -> str:
    """``root/{train2017,val2017}/*.jpg`` and ``root/annotations/instances_*2017.json``.

    Every image has two rectangles with boxes and polygons, of COCO categories 1 and 2
    (person, bicycle); the category list is COCO's 80 classes, as mmdet's CocoDataset
    looks them up by name. Heights grow by 8 px per image, so that a batch holds images of
    different sizes, as COCO's do.
    """
    from mmdet.datasets import CocoDataset
    rng = np.random.RandomState(seed)
    root = Path(root)
    categories = [dict(id=i + 1, name=name)
                  for i, name in enumerate(CocoDataset.METAINFO['classes'])]
    annotation_id = 0
    for split, count in (('train2017', train_images), ('val2017', val_images)):
        (root / split).mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for index in range(count):
            image_id = len(images) + 1
            height, width = size[0] + 8 * index, size[1]
            img, boxes = _shapes_image(rng, height, width)
            name = f'{index:012d}.jpg'
            Image.fromarray(img).save(root / split / name, quality=95)
            images.append(dict(id=image_id, file_name=name, height=height, width=width))
            for k, (x, y, w, h) in enumerate(boxes):
                annotation_id += 1
                polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
                annotations.append(dict(
                    id=annotation_id, image_id=image_id, category_id=k + 1,
                    bbox=[x, y, w, h], area=float(w * h), iscrowd=0,
                    segmentation=[[float(v) for v in polygon]]))
        (root / 'annotations').mkdir(exist_ok=True)
        with open(root / 'annotations' / f'instances_{split}.json', 'w') as f:
            json.dump(dict(images=images, annotations=annotations, categories=categories), f)
    return str(root)


def make_tiny_cityscapes(root, train_images: int = 2, val_images: int = 2,
                         size=(128, 256), seed: int = 0) -> str:
    """``root/leftImg8bit/{train,val}/<city>/*_leftImg8bit.png`` and the matching
    ``root/gtFine/.../*_gtFine_labelTrainIds.png`` label maps (classes 0-18, 255 ignored)."""
    rng = np.random.RandomState(seed)
    root = Path(root)
    for split, count in (('train', train_images), ('val', val_images)):
        images = root / 'leftImg8bit' / split / 'tinycity'
        labels = root / 'gtFine' / split / 'tinycity'
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            img, boxes = _shapes_image(rng, *size)
            label = np.zeros(size, dtype=np.uint8)               # road everywhere ...
            label[:size[0] // 4] = 10                             # ... under a sky band
            label[-4:] = 255                                      # an ignored border
            for k, (x, y, w, h) in enumerate(boxes):
                label[y:y + h, x:x + w] = 11 + k                  # person, rider
            stem = f'tinycity_{index:06d}_000019'
            Image.fromarray(img).save(images / f'{stem}_leftImg8bit.png')
            Image.fromarray(label).save(labels / f'{stem}_gtFine_labelTrainIds.png')
    return str(root)
