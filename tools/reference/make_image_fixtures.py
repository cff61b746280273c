# Writes tests/data/image/: small image files made from real photos (Debian python3-skimage and
# opencv-doc), one or more per format and pixel layout, and what the image plugin must produce for
# them — Hugging Face image processors' pixel_values, PIL's decoded RGB, a Conv2d over the patches.
# Developer-run only (see tests/data/image/README.md); the C++ tests never run Python.
#
#   .venv-ref/bin/python tools/reference/make_image_fixtures.py
#
# Needs Pillow, NumPy, torch and transformers (the reference venv), and the Debian packages
# python3-skimage and opencv-doc for the source photos. Deterministic: rerunning rewrites the same
# bytes for the same library versions.
import io
import json
import pathlib
import struct
import sys
import zlib

import numpy as np
import PIL
import torch
import transformers
from PIL import Image, ImageOps
from transformers import CLIPImageProcessor, ViTImageProcessor
from transformers.image_utils import PILImageResampling

SKIMAGE = pathlib.Path("/usr/lib/python3/dist-packages/skimage/data")
OPENCV = pathlib.Path("/usr/share/doc/opencv-doc/examples/data")
OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "image"

# Small model inputs keep the references small: (32, 48) is 2 × 3 patches of 16, not square, so a
# height/width mix-up shows. Two images are also checked at ViT's default 224 × 224.
SMALL = {"height": 32, "width": 48}
SMALL_OPTIONS = {"image_size": "32,48"}
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def shrink(im, longest):
    """A real photo made small (Lanczos), keeping its aspect ratio."""
    f = longest / max(im.size)
    return im.resize((max(1, round(im.width * f)), max(1, round(im.height * f))), Image.Resampling.LANCZOS)


def png16(path, a):
    """Writes a 16-bit PNG (grey: (H, W); RGB: (H, W, 3)) — PIL cannot write 16-bit RGB."""
    h, w = a.shape[:2]
    colour = 2 if a.ndim == 3 else 0
    raw = b"".join(b"\x00" + a[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) +
                     chunk(b"IEND", b""))


def exif_with_orientation(k):
    e = Image.Exif()
    e[0x0112] = k
    return e.tobytes()


def pil_rgb(path):
    """The RGB image the plugin must decode, as PIL gives it: EXIF orientation, then convert("RGB")."""
    return ImageOps.exif_transpose(Image.open(path)).convert("RGB")


def make_files():
    """Writes the image files; returns {file: (PIL RGB reference image, how it was made)}."""
    made = {}

    def keep(name, how, rgb=None):
        made[name] = (rgb if rgb is not None else pil_rgb(OUT / name), how)

    astronaut = Image.open(SKIMAGE / "astronaut.png")
    shrink(astronaut, 256).save(OUT / "astronaut.png", icc_profile=astronaut.info["icc_profile"])
    keep("astronaut.png", "skimage astronaut.png, 512² → 256² (Lanczos), RGB PNG keeping its iCCP profile chunk")

    Image.open(SKIMAGE / "chelsea.png").save(OUT / "chelsea.jpg", quality=90)
    keep("chelsea.jpg", "skimage chelsea.png (451×300) as JPEG, quality 90, 4:2:0")

    coffee = shrink(Image.open(SKIMAGE / "coffee.png"), 150)  # 150×100, stored landscape
    coffee.save(OUT / "coffee_exif6.jpg", quality=90, exif=exif_with_orientation(6))
    keep("coffee_exif6.jpg", "skimage coffee.png → 150×100 JPEG with EXIF orientation 6 (displays 100×150)")

    shrink(Image.open(SKIMAGE / "camera.png"), 128).save(OUT / "camera_grey.png")
    keep("camera_grey.png", "skimage camera.png → 128² 8-bit grey PNG (mode L)")

    rocket = shrink(Image.open(SKIMAGE / "rocket.jpg"), 120).convert("RGB")
    yy, xx = np.mgrid[0:rocket.height, 0:rocket.width]
    alpha = np.clip(255 - 4 * np.hypot(xx - rocket.width / 2, yy - rocket.height / 2), 0, 255).astype(np.uint8)
    rgba = np.dstack([np.array(rocket), alpha])
    Image.fromarray(rgba, "RGBA").save(OUT / "rocket_rgba.png")
    keep("rocket_rgba.png", "skimage rocket.jpg → 120×80 RGB plus a radial alpha channel (RGBA PNG, mostly transparent)")

    hubble = np.array(shrink(Image.open(SKIMAGE / "hubble_deep_field.jpg"), 120))
    low = np.random.RandomState(16).randint(0, 256, hubble.shape).astype(np.uint16)
    png16(OUT / "hubble_rgb16.png", hubble.astype(np.uint16) * 256 + low)
    keep("hubble_rgb16.png", "skimage hubble_deep_field.jpg → 120×105, 16-bit RGB PNG: high byte = the photo, "
         "low byte = noise (seed 16)")

    cam = np.array(shrink(Image.open(SKIMAGE / "camera.png"), 96))
    low = np.random.RandomState(17).randint(0, 256, cam.shape).astype(np.uint16)
    png16(OUT / "camera_grey16.png", cam.astype(np.uint16) * 256 + low)
    # PIL opens 16-bit grey as mode I and convert("RGB") clips at 255; the plugin keeps the high
    # byte, as PIL itself does for 16-bit RGB. The reference is PIL's RGB of that high byte.
    high = (np.array(Image.open(OUT / "camera_grey16.png")) >> 8).astype(np.uint8)
    keep("camera_grey16.png", "skimage camera.png → 96², 16-bit grey PNG: high byte = the photo, low byte = noise "
         "(seed 17); reference = the high byte (PIL would clip mode I at 255)", Image.fromarray(high, "L").convert("RGB"))

    fruits = shrink(Image.open(OPENCV / "fruits.jpg"), 96)
    fruits.save(OUT / "fruits.bmp")
    keep("fruits.bmp", "opencv-doc fruits.jpg → 96×90, 24-bit BMP")
    fruits.convert("CMYK").save(OUT / "fruits_cmyk.jpg", quality=90)
    keep("fruits_cmyk.jpg", "opencv-doc fruits.jpg → 96×90, CMYK JPEG (Adobe inverted, as PIL writes it)")
    fruits.save(OUT / "fruits.ppm")
    keep("fruits.ppm", "opencv-doc fruits.jpg → 96×90, binary PPM (P6)")
    shrink(Image.open(SKIMAGE / "coins.png"), 96).save(OUT / "coins.pgm")
    keep("coins.pgm", "skimage coins.png → 96×76, binary PGM (P5)")

    shrink(Image.open(OPENCV / "butterfly.jpg"), 96).save(OUT / "butterfly.tif", compression="tiff_lzw")
    keep("butterfly.tif", "opencv-doc butterfly.jpg → 96×69, LZW-compressed RGB TIFF")
    # A TIFF with Orientation 6: PIL (through libtiff) rotates it while loading; its exif_transpose
    # would rotate a second time, so the reference is the loaded image.
    butterfly = shrink(Image.open(OPENCV / "butterfly.jpg"), 64)
    butterfly.save(OUT / "butterfly_orient6.tif", tiffinfo={274: 6})
    loaded = Image.open(OUT / "butterfly_orient6.tif").convert("RGB")
    assert np.array_equal(np.array(loaded), np.array(butterfly.transpose(Image.Transpose.ROTATE_270)))
    keep("butterfly_orient6.tif", "opencv-doc butterfly.jpg → 64×46 TIFF with Orientation 6 (displays 46×64); "
         "reference = PIL's loaded image, rotated once", loaded)

    shrink(Image.open(OPENCV / "home.jpg"), 96).save(OUT / "home.webp", quality=80)
    keep("home.webp", "opencv-doc home.jpg → 96×72, lossy WebP quality 80")
    shrink(Image.open(SKIMAGE / "retina.jpg"), 96).quantize(64).save(OUT / "retina_palette.png", transparency=0)
    keep("retina_palette.png", "skimage retina.jpg → 96², 64-colour palette PNG with a transparent index")

    Image.open(SKIMAGE / "chelsea.png").crop((180, 60, 210, 80)).save(OUT / "chelsea_tiny.png")
    keep("chelsea_tiny.png", "skimage chelsea.png, the 30×20 crop at (180, 60): upscaled by the model input")

    # One JPEG stream, eight EXIF orientations (the tag value is the only difference).
    base = shrink(Image.open(SKIMAGE / "coffee.png"), 24)  # 24×16
    for k in range(1, 9):
        name = f"orientation_{k}.jpg"
        base.save(OUT / name, quality=95, exif=exif_with_orientation(k))
        keep(name, f"skimage coffee.png → 24×16 JPEG with EXIF orientation {k}")
    # OpenCV 4.6 ignores EXIF in WebP and PNG; PIL's exif_transpose does not, nor does the plugin.
    base.save(OUT / "orientation_6.png", exif=exif_with_orientation(6))
    keep("orientation_6.png", "skimage coffee.png → 24×16 PNG with an eXIf chunk, orientation 6")
    base.save(OUT / "orientation_8.webp", lossless=True, exif=exif_with_orientation(8))
    keep("orientation_8.webp", "skimage coffee.png → 24×16 lossless WebP with an EXIF chunk, orientation 8")
    return made


def make_unreadable_files():
    """Files the plugin must refuse that a test cannot easily derive from the good ones."""
    ramp = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    Image.fromarray(ramp, "F").save(OUT / "float32.tif")
    return {"float32.tif": "an 8×8 ramp of 32-bit float samples (TIFF, synthetic): OpenCV cannot read it as 8-bit"}


def save_npy(name, a):
    np.save(OUT / name, a)
    return name


def references(made):
    """(cases, decoded): processor references per file and options, and PIL's decoded pixels."""
    cases = []

    def case(name, file, processor, options, what):
        rgb = made[file][0]
        pv = processor(rgb, return_tensors="np")["pixel_values"].astype(np.float32)
        cases.append({"name": name, "file": file, "options": options, "what": what,
                      "pixel_values": save_npy(name + ".pixel_values.npy", pv)})
        return torch.from_numpy(pv)

    vit = ViTImageProcessor()  # 224 × 224 bilinear, rescale 1/255, mean = std = 0.5
    pv = case("astronaut_vit224", "astronaut.png", vit, {}, "ViTImageProcessor() defaults")
    case("chelsea_vit224", "chelsea.jpg", vit, {}, "ViTImageProcessor() defaults")

    small = ViTImageProcessor(size=SMALL)
    for file in made:
        if not file.startswith("orientation_"):
            case(file.replace(".", "_") + "_vit32x48", file, small, SMALL_OPTIONS, "ViTImageProcessor(size=32×48)")
    bicubic = ViTImageProcessor(size=SMALL, resample=PILImageResampling.BICUBIC)
    for file in ["astronaut.png", "chelsea_tiny.png"]:
        case(file.replace(".", "_") + "_vit32x48_bicubic", file, bicubic, dict(SMALL_OPTIONS, resize="pil_bicubic"),
             "ViTImageProcessor(size=32×48, resample=BICUBIC)")
    # One side kept: Pillow skips that pass (patch_size 2 lets the sides be 30 and 20 wide).
    for h, w in [(32, 30), (20, 32)]:
        case(f"chelsea_tiny_png_vit{h}x{w}", "chelsea_tiny.png", ViTImageProcessor(size={"height": h, "width": w}),
             {"image_size": f"{h},{w}", "patch_size": "2"}, f"ViTImageProcessor(size={h}×{w}): one side unchanged")
    clip_options = {"resize": "pil_bicubic", "center_crop": "true", "image_size": "64",
                    "mean": ",".join(map(str, CLIP_MEAN)), "std": ",".join(map(str, CLIP_STD))}
    clip72 = CLIPImageProcessor(size={"shortest_edge": 72}, crop_size={"height": 64, "width": 64})
    case("chelsea_clip72crop64", "chelsea.jpg", clip72, dict(clip_options, resize_shortest_edge="72"),
         "CLIPImageProcessor(shortest_edge=72, crop 64×64): landscape")
    clip64 = CLIPImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})
    case("coffee_clip64crop64", "coffee_exif6.jpg", clip64, clip_options,
         "CLIPImageProcessor(shortest_edge=64, crop 64×64): portrait after EXIF rotation")

    # The patch order a Conv2d patch embedding sees: a random 16×16 stride-16 convolution over the
    # default astronaut pixel_values, to be reproduced as (patch rows) · (weights as rows).
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(4, 3, 16, 16, generator=g) / 16
    conv = torch.nn.functional.conv2d(pv, weight, stride=16)  # (1, 4, 14, 14)
    unfolded = pv.unfold(2, 16, 16).unfold(3, 16, 16).permute(0, 2, 3, 1, 4, 5).reshape(196, 768)
    assert torch.allclose(unfolded @ weight.reshape(4, -1).T, conv[0].permute(1, 2, 0).reshape(196, 4), atol=1e-4)
    conv_ref = {"case": "astronaut_vit224", "weight": save_npy("conv_weight.npy", weight.numpy()),
                "output": save_npy("conv_output.npy", conv.numpy())}

    decoded = []
    for file, (rgb, how) in made.items():
        if file in ("astronaut.png", "chelsea.jpg"):
            continue  # covered by their pixel_values at 224; their RGB would add 0.4 MB
        decoded.append({"file": file, "made": how, "rgb": save_npy(file.replace(".", "_") + ".rgb.npy",
                                                                    np.array(rgb, dtype=np.uint8))})
    return cases, decoded, conv_ref


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    made = make_files()
    cases, decoded, conv = references(made)
    manifest = {
        "versions": {"python": sys.version.split()[0], "numpy": np.__version__, "pillow": PIL.__version__,
                     "torch": torch.__version__, "transformers": transformers.__version__},
        "files": {f: how for f, (_, how) in made.items()},
        "unreadable": make_unreadable_files(),
        "cases": cases,
        "decoded": decoded,
        "conv": conv,
    }
    (OUT / "fixtures.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{len(made)} images, {len(cases)} cases, {len(decoded)} decoded references: {total / 1e6:.2f} MB in {OUT}")


if __name__ == "__main__":
    main()
