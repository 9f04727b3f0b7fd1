#!/usr/bin/env python3
"""Writes a trained tiny model and its references as testdata/models/NAME.tar.gz.

    python3 scripts/tiny/testdata.py MODEL_DIR REFS_JSON testdata/models/NAME.tar.gz

Each bf16 .safetensors file is stored as its even and odd bytes (NAME.even,
NAME.odd): the exponent bytes compress and the mantissa bytes do not, which
is what lets gzip shrink a checkpoint by a third. The references go in as
NAME.json beside the model directory. internal/testutil joins the bytes
again when a test first asks for the model.
"""
import io, os, sys, tarfile

src, refs, dst = sys.argv[1], sys.argv[2], sys.argv[3]
name = os.path.basename(src.rstrip("/"))
with tarfile.open(dst, "w:gz", compresslevel=9) as t:
    def add(n, data):
        ti = tarfile.TarInfo(n)
        ti.size = len(data)
        ti.mode = 0o644
        t.addfile(ti, io.BytesIO(data))

    for f in sorted(os.listdir(src)):
        b = open(os.path.join(src, f), "rb").read()
        if f.endswith(".safetensors"):
            add(f"{name}/{f}.even", b[0::2])
            add(f"{name}/{f}.odd", b[1::2])
        else:
            add(f"{name}/{f}", b)
    add(f"{name}.json", open(refs, "rb").read())
print(dst, os.path.getsize(dst))
