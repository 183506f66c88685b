"""Write the evidence data: animal object images and detection / segmentation scenes.

    python projects/mst_research/tools/write_animal_shapes.py data/animal_shapes

writes ``OUT/objects`` (8,000 train and 2,000 test 32 x 32 images, ``<split>/<class>/*.png``,
with the object masks in ``<split>_masks.npz``) and ``OUT/scenes`` (COCO annotations and mmseg
label maps) as ``mst_research.data`` renders them, fixed by ``--seed`` and kept when written
with the same settings.
"""
import argparse
import os.path as osp

from mst_research.data import write_object_images, write_scenes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('out', help='folder to write objects/ and scenes/ into')
    parser.add_argument('--train-scenes', type=int, default=400)
    parser.add_argument('--val-scenes', type=int, default=100)
    parser.add_argument('--seed', type=int, default=0, help='seed of the split and rendering')
    args = parser.parse_args()
    objects = write_object_images(osp.join(args.out, 'objects'), seed=args.seed)
    scenes = write_scenes(osp.join(args.out, 'scenes'), args.train_scenes, args.val_scenes,
                          seed=args.seed)
    print(f"objects: {objects['train']} train / {objects['test']} test images; scenes: "
          f"{scenes['train']['images']} train / {scenes['val']['images']} val")


if __name__ == '__main__':
    main()
