#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora: fuzz/corpus/safetensors/ and fuzz/corpus/config/.

safetensors seeds are tiny valid files written byte by byte (no numpy, no safetensors package);
config seeds are copies of tests/fixtures/configs/*/config.json. Run from anywhere; the output is
checked in, so run it again only when the seeds should change.
"""
import json
import pathlib
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "corpus"

SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U8": 1, "BOOL": 1}


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape); data bytes are 1, 2, 3, ... so no tensor is all zeros."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((len(data) + i + 1) % 256 for i in range(n))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


SEEDS = {
    "empty_header": safetensors([]),
    "one_f32": safetensors([("w", "F32", [2])], {"format": "pt"}),
    "dtypes": safetensors([("a.bf16", "BF16", [2, 2]), ("b.fp8", "F8_E4M3", [4]), ("c.i64", "I64", [1]),
                           ("d.bool", "BOOL", [3]), ("e.f16", "F16", [1, 1, 2])]),
    "empty_and_scalar": safetensors([("empty", "U8", [0, 5]), ("scalar", "F64", [])]),
    "fp8_weight_and_scale": safetensors([("model.layers.0.mlp.down_proj.weight", "F8_E4M3", [2, 4]),
                                         ("model.layers.0.mlp.down_proj.weight_scale_inv", "F32", [1, 1])],
                                        {"format": "pt"}),
}


def main():
    st_dir, cfg_dir = OUT / "safetensors", OUT / "config"
    for d in (st_dir, cfg_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    for name, blob in SEEDS.items():
        (st_dir / f"{name}.safetensors").write_bytes(blob)
    for cfg in sorted((ROOT / "tests" / "fixtures" / "configs").glob("*/config.json")):
        shutil.copyfile(cfg, cfg_dir / f"{cfg.parent.name}.json")


if __name__ == "__main__":
    main()
