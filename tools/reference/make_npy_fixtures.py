# Writes small reference .npy files with NumPy into tests/data/npy/, plus expected.json holding,
# for each file, the shape and the raw bytes (hex) of the f32/int tensor Tessera should load.
# Developer-run only (see tests/data/npy/README.md); the C++ tests never run Python.
import json
import pathlib
import sys

import numpy as np

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "npy"


def fixtures():
    """file name -> (array, format version or None for NumPy's choice)."""
    return {
        "f4.npy": (np.arange(6, dtype=np.float32).reshape(2, 3) / 3, None),
        "f2.npy": (np.array([0.5, -2.0, 65504.0, 6e-8], dtype=np.float16), None),
        "f8.npy": (np.array([[1.0 / 3.0, -1e-40], [1e300, np.pi]], dtype=np.float64), None),
        "i4.npy": (np.array([[-7], [2**31 - 1]], dtype=np.int32), None),
        "i8.npy": (np.array([-(2**63), 0, 2**40], dtype=np.int64), None),
        "u1.npy": (np.array([0, 200, 255], dtype=np.uint8), None),
        "b1.npy": (np.array([[True, False], [False, True]]), None),
        "scalar.npy": (np.array(2.5, dtype=np.float32), None),
        "empty.npy": (np.zeros((0, 3), dtype=np.float32), None),
        "v2.npy": (np.arange(4, dtype=np.int64).reshape(2, 2, 1), (2, 0)),
    }


def loaded_bytes(a):
    """The bytes Tessera's tensor holds after load: f8 becomes f32, bool becomes u8."""
    if a.dtype == np.float64:
        with np.errstate(over="ignore"):  # 1e300 becomes inf in f32, on purpose
            return a.astype(np.float32).tobytes()
    return a.astype(np.uint8).tobytes() if a.dtype == np.bool_ else a.tobytes()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    expected = {"versions": {"numpy": np.__version__}, "files": {}}
    for fname, (a, version) in fixtures().items():
        with open(OUT / fname, "wb") as f:
            np.lib.format.write_array(f, a, version=version)
        expected["files"][fname] = {"shape": list(a.shape), "hex": loaded_bytes(a).hex()}
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(expected['files'])} files to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
