# Writes small reference .safetensors files with the real `safetensors` package (and torch for
# bf16) into tests/data/safetensors/, plus expected.json holding each tensor's raw bytes in hex.
# Developer-run only (see tests/data/safetensors/README.md); the C++ tests never run Python.
import json
import pathlib
import sys

import numpy as np
import safetensors
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file as save_torch

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "safetensors"

F32_SPECIAL = np.array([0.0, -0.0, 1.0 / 3.0, -2.5, np.inf, -np.inf, np.nan, 1e-45, 3.4028235e38],
                       dtype=np.float32)


def fixtures():
    """file name -> (tensors, metadata, which library writes them). The writer orders tensors itself."""
    return {
        "f32.safetensors": ({
            "weight": np.arange(12, dtype=np.float32).reshape(3, 4) / 8,
            "special": F32_SPECIAL,
        }, None, "numpy"),
        "bf16.safetensors": ({
            "w": (torch.arange(-6, 6, dtype=torch.float32) / 3).to(torch.bfloat16).reshape(2, 2, 3),
        }, None, "torch"),
        "f16.safetensors": ({
            "h": np.array([[0.0, 1.0, -65504.0], [6e-8, 0.1, np.inf]], dtype=np.float16),
        }, None, "numpy"),
        "i64.safetensors": ({
            "positions": np.array([0, 1, -1, 2**62, -(2**63), 2**63 - 1], dtype=np.int64),
        }, None, "numpy"),
        "mixed.safetensors": ({
            "ids": np.array([[7, -3], [0, 2**31 - 1]], dtype=np.int32),
            "nothing": np.zeros((0, 4), dtype=np.float32),
            "bytes": np.array([0, 1, 127, 255, 9], dtype=np.uint8),
        }, None, "numpy"),
        "bool.safetensors": ({
            "mask": np.array([True, False, True], dtype=np.bool_),
        }, None, "numpy"),
        "metadata.safetensors": ({
            "scale": np.array([2.0], dtype=np.float32),
        }, {"format": "pt"}, "numpy"),
    }


def raw_bytes(t):
    if isinstance(t, torch.Tensor):
        return t.contiguous().view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 \
            else t.contiguous().numpy().tobytes()
    return np.ascontiguousarray(t).tobytes()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    expected = {"versions": {"safetensors": safetensors.__version__, "numpy": np.__version__,
                             "torch": torch.__version__}, "files": {}}
    for fname, (tensors, metadata, writer) in fixtures().items():
        (save_torch if writer == "torch" else save_numpy)(tensors, str(OUT / fname), metadata=metadata)
        expected["files"][fname] = {
            "metadata": metadata or {},
            "tensors": {name: {"shape": list(t.shape), "hex": raw_bytes(t).hex()}
                        for name, t in tensors.items()},
        }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(expected['files'])} files to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
