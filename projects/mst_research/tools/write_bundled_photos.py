"""Write random crops of scikit-image's bundled photos into an unlabelled image folder.

    python projects/mst_research/tools/write_bundled_photos.py data/bundled_photos --num-images 2048

The folder trains with any pretraining config by pointing ``data_root`` at it; see
``mst_research.data.write_photo_crops`` for what it is (and is not) good for.
"""
import argparse

from mst_research.data import write_photo_crops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('out', help='folder to write the JPEGs into')
    parser.add_argument('--num-images', type=int, default=2048, help='number of crops')
    parser.add_argument('--size', type=int, default=256, help='side of each square crop, px')
    parser.add_argument('--seed', type=int, default=0, help='seed of the crop positions')
    args = parser.parse_args()
    summary = write_photo_crops(args.out, args.num_images, args.size, args.seed)
    print(f'{summary["num_images"]} crops of {len(summary["sources"])} photos in {args.out}')


if __name__ == '__main__':
    main()
