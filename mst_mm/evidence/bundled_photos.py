"""Random crops of scikit-image's bundled photographs: a flat folder for sanity-checking the
full-size configs without a download (too few scenes to learn features from)."""
import json
import os
import os.path as osp
from typing import Dict, Optional

import numpy as np

PHOTOS = ('astronaut', 'camera', 'cat', 'coffee', 'rocket', 'retina', 'hubble_deep_field',
          'immunohistochemistry', 'brick', 'grass', 'gravel', 'moon', 'coins', 'cell')


def write_photo_crops(out: str, num_images: int = 2048, size: int = 256,
                      seed: int = 0, height: Optional[int] = None) -> Dict[str, object]:
    """Write ``num_images`` random crops of the bundled photos to ``out/<i>.jpg`` once.

    Args:
        out (str): Folder to write; one written with the same arguments is kept.
        num_images (int): Crops to write, drawn round-robin from :data:`PHOTOS`.
        size (int): Width of the JPEGs, in pixels.
        seed (int): Seed of the crop positions and sizes.
        height (int, optional): Height of the JPEGs; ``None``: ``size`` (square). 500 x 375
            is an average ImageNet photo's size.

    Returns:
        dict: The summary also stored in ``out/photos.json``.
    """
    from PIL import Image
    from skimage import data
    from skimage.util import img_as_ubyte

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
        img = img_as_ubyte(getattr(data, name)())
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
    with open(stamp, 'w') as f:
        json.dump(summary, f, indent=2)
    return summary
