#!/usr/bin/env python3
"""Carry token shards to a machine in xz instead of zstd: ~6.5% smaller (the two offline
corpora: 34.9 MB as zstd-19 token shards, 32.6 MB as xz -9e), which let the binaries and both
corpora fit in a device command's 64 MiB until 2026-12-07. Since then (a 7.2 MB tree, a 31.4 MB
dist/gpu.tar.xz) they do not: carry the binaries with one corpus (`pack` writes one folder per
corpus: carry `DST/corpus`), then the other corpus alone in the next command while the machine is
warm (its /tmp and the unpacked shards stay), as reproduce/records/logs/device-log-2026-12-08a.txt
did.

  scripts/xz_token_shards.py pack SRC DST     # SRC/**/*.tokens.zst -> DST/**/*.tokens.xz (needs the zstd CLI)
  scripts/xz_token_shards.py unpack SRC DST   # SRC/**/*.tokens.xz -> DST/**/*.tokens.zst (Python alone)

`unpack` writes each shard as a zstd frame of raw (stored) blocks (RFC 8878, 3.1.1: single
segment, content size in the header, blocks of at most 128 KiB), which any zstd decoder reads:
the GPU machine has neither the zstd CLI nor a zstd module, and the shards it reads there are
read once per run, so storing them uncompressed costs nothing that matters.
"""
import lzma
import pathlib
import struct
import subprocess
import sys

BLOCK = 128 * 1024


def raw_zstd_frame(data: bytes) -> bytes:
    """`data` as one zstd frame of raw blocks (magic, descriptor 0xE0: 8-byte content size,
    single segment, no checksum; 3-byte block headers: last flag, type 0 = raw, size)."""
    out = [struct.pack("<IBQ", 0xFD2FB528, 0xE0, len(data))]
    chunks = [data[i : i + BLOCK] for i in range(0, len(data), BLOCK)] or [b""]
    for i, c in enumerate(chunks):
        last = 1 if i == len(chunks) - 1 else 0
        out.append(struct.pack("<I", last | (len(c) << 3))[:3] + c)
    return b"".join(out)


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    mode, src, dst = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    ext_in, ext_out = (".tokens.zst", ".tokens.xz") if mode == "pack" else (".tokens.xz", ".tokens.zst")
    files = sorted(src.rglob("*" + ext_in))
    if not files:
        sys.exit(f"{src}: no *{ext_in} files")
    for f in files:
        out = dst / f.relative_to(src).with_name(f.name[: -len(ext_in)] + ext_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if mode == "pack":
            data = subprocess.run(["zstd", "-dc", str(f)], check=True, capture_output=True).stdout
            out.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
        else:
            out.write_bytes(raw_zstd_frame(lzma.decompress(f.read_bytes())))
        print(f"{f} -> {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
