#!/usr/bin/env python3
"""SHA-256 of the first SIZE bytes the emulator's export server serves for a PVC.

An independent implementation (standard library only) of the content definition documented
in tests/emulator/src/kubevirt/export.rs, used to write out the expected digests in tests/e2e/export.rs:

  key     = FNV-1a-64("NAMESPACE/PVC") XOR (GENERATION * 0x9e3779b97f4a7c15 mod 2^64)
  byte p  = byte (p mod 8), little-endian, of splitmix64(key XOR (p div 8))

Usage: export-content-sha256.py NAMESPACE/PVC GENERATION SIZE [SIZE...]
Prints "SIZE SHA256" for each SIZE (one pass; sizes need not be sorted).
"""
import hashlib
import struct
import sys

M = (1 << 64) - 1


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for b in text.encode():
        h ^= b
        h = (h * 0x100000001B3) & M
    return h


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)


def main():
    ident, generation = sys.argv[1], int(sys.argv[2])
    sizes = sorted({int(s) for s in sys.argv[3:]})
    key = fnv1a64(ident) ^ ((generation * 0x9E3779B97F4A7C15) & M)
    digest = hashlib.sha256()
    pos = 0
    step = 1 << 16  # bytes per chunk, a multiple of 8
    for size in sizes:
        while pos < size:
            n = min(step, size - pos)
            first = pos // 8
            words = (n + (pos % 8) + 7) // 8
            chunk = struct.pack(
                "<%dQ" % words, *(splitmix64(key ^ w) for w in range(first, first + words))
            )
            start = pos % 8
            digest.update(chunk[start : start + n])
            pos += n
        print(size, digest.copy().hexdigest(), flush=True)


if __name__ == "__main__":
    main()
