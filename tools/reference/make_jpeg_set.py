#!/usr/bin/env python3
"""Make a folder of real JPEG photos for timing `tessera run` on images (developer-only).

    python3 tools/reference/make_jpeg_set.py /tmp/jpegs            # 1,000 JPEGs
    python3 tools/reference/make_jpeg_set.py /tmp/jpegs --count 200 --seed 7

Each file is a random crop (40-100 % of each side) of a real photo, rescaled so that its long side
is 240-640 pixels (ImageNet-like sizes), saved at JPEG quality 75-95, some as greyscale. The
photos are the ones Debian's python3-skimage ships in skimage/data (astronaut, chelsea, coffee,
rocket, motorcycles, Hubble, retina, camera, coins, moon, ...) plus the real photos bundled in this
repository (tests/data/image, configs/experiments/quickstart). Without scikit-image
(`apt-get install python3-skimage`) the repository's photos alone are used. Needs Pillow
(python3-pil). Deterministic for a given --seed. Writes nothing into the repository.
"""
import argparse
import os
import random
import sys

from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Real photographs in skimage/data (not the synthetic or binary images that sit beside them).
SKIMAGE_PHOTOS = [
    "astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
    "motorcycle_right.png", "hubble_deep_field.jpg", "retina.jpg", "ihc.png", "camera.png",
    "coins.png", "moon.png", "brick.png", "grass.png", "gravel.png", "page.png",
]
REPO_PHOTOS = [
    "tests/data/image/chelsea.jpg", "tests/data/image/astronaut.png",
    "configs/experiments/quickstart/cat.jpg", "configs/experiments/quickstart/coffee.jpg",
]


def skimage_data_dir():
    try:
        import skimage  # noqa: F401  (Debian's python3-skimage)
        d = os.path.join(os.path.dirname(skimage.__file__), "data")
        if os.path.isdir(d):
            return d
    except ImportError:
        pass
    d = "/usr/lib/python3/dist-packages/skimage/data"  # when another Python runs the script
    return d if os.path.isdir(d) else None


def sources():
    paths = []
    d = skimage_data_dir()
    if d:
        paths += [os.path.join(d, n) for n in SKIMAGE_PHOTOS if os.path.exists(os.path.join(d, n))]
    paths += [os.path.join(REPO, p) for p in REPO_PHOTOS if os.path.exists(os.path.join(REPO, p))]
    if not paths:
        sys.exit("make_jpeg_set: no photos found (install python3-skimage, or run from the repository)")
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="folder to write the JPEGs to (created; outside the repository)")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    if out == REPO or out.startswith(REPO + os.sep):
        sys.exit("make_jpeg_set: write the set outside the repository (e.g. /tmp/jpegs)")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(a.seed)
    photos = []
    for p in sources():
        im = Image.open(p)
        im.load()
        photos.append((os.path.splitext(os.path.basename(p))[0], im.convert("RGB") if im.mode not in ("L", "RGB") else im))
    total = 0
    for i in range(a.count):
        name, im = photos[i % len(photos)]
        w, h = im.size
        cw, ch = max(16, int(w * rng.uniform(0.4, 1.0))), max(16, int(h * rng.uniform(0.4, 1.0)))
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        crop = im.crop((x, y, x + cw, y + ch))
        s = rng.uniform(240, 640) / max(cw, ch)
        crop = crop.resize((max(1, round(cw * s)), max(1, round(ch * s))), Image.BICUBIC)
        if crop.mode == "RGB" and rng.random() < 0.05:
            crop = crop.convert("L")
        path = os.path.join(out, "%04d_%s.jpg" % (i, name))
        crop.save(path, "JPEG", quality=rng.randint(75, 95))
        total += os.path.getsize(path)
    print("%s: %d JPEGs from %d photos, %.1f MB" % (out, a.count, len(photos), total / 1e6))


if __name__ == "__main__":
    main()
