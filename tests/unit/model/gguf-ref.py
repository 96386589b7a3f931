#!/usr/bin/env python3
"""Dequantization against the `gguf` package (the format's Python reference, the one
transformers' GGUF loader uses): writes a GGUF file with the gguf package's GGUFWriter
holding, for each type ganglion reads, a tensor of random blocks (sane f16 scales, random
quants and packed scales) and next to it the package's own dequantization in F32; then
`test-gguf --ref FILE` reads both with ganglion's reader and requires them equal, element
for element (NaN = NaN).

  gguf-ref.py TEST_GGUF_BINARY

Run by CTest (unit-model-gguf-ref) with the Python of scripts/fetch-reference.sh; exit 77
(SKIP) with the reason when that Python or its gguf package is missing."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
except ImportError as e:
    print("SKIP: the gguf package is missing (%s)" % e)
    sys.exit(77)

# Byte offsets of the f16 scales in each block (set to sane values; the rest is random).
SCALES = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
          T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.F16: [], T.BF16: []}
ROWS, BLOCKS = 3, 2


def main():
    binary = sys.argv[1]
    rng = np.random.default_rng(12)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ref.gguf")
        w = gguf.GGUFWriter(path, "llama")
        for qt, offs in SCALES.items():
            block, size = gguf.GGML_QUANT_SIZES[qt]
            cols = block * BLOCKS * (128 if block == 1 else 1)
            raw = rng.integers(0, 256, size=(ROWS, cols // block * size), dtype=np.uint8)
            blocks = raw.reshape(ROWS, -1, size)
            for o in offs:
                s = rng.normal(0, 0.05, size=blocks.shape[:2]).astype(np.float16)
                blocks[:, :, o:o + 2] = s.view(np.uint8).reshape(ROWS, -1, 2)
            raw = blocks.reshape(ROWS, -1)
            want = gguf.quants.dequantize(raw, qt).astype(np.float32)
            assert want.shape == (ROWS, cols), (qt.name, want.shape)
            w.add_tensor("q." + qt.name, raw, raw_dtype=qt)
            w.add_tensor("want." + qt.name, want)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        r = subprocess.run([binary, "--ref", path])
        sys.exit(r.returncode)


if __name__ == "__main__":
    main()
