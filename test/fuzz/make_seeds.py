#!/usr/bin/env python3
"""Writes the build-time seed corpora of the ELF and CFI fuzzers from small ELF files.

make_seeds.py OUT_DIR ELF...

  OUT_DIR/elf/<name>             the file itself
  OUT_DIR/elf/<name>.noshdr      the same without section headers (e_shoff = e_shnum = 0), so the
                                 reader falls back to program headers (PT_NOTE build id)
  OUT_DIR/cfi/<name>             the file itself (fuzz_cfi's ELF mode)
  OUT_DIR/cfi/<name>.eh_frame    fuzz_cfi's raw mode: flags byte, u32 vaddr, the section bytes
  OUT_DIR/cfi/<name>.debug_frame (test/fuzz/fuzz_cfi.cc describes the layout)

  OUT_DIR/cfi/handmade.*         raw-mode sections assembled here, with the rules the walker
                                 supports (frame-pointer prologue, remember/restore_state, signal
                                 frame, PLT and realigned-stack expressions, the outermost frame)
                                 and a version 4 .debug_frame, as in test/unit/cfi_test.cc

Only ELF64 little-endian files are split into sections (the seeds are built on x86-64).
"""
import os
import struct
import sys


def sections(image):
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        return {}
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    if shoff == 0 or shnum == 0:
        return {}
    headers = []
    for i in range(shnum):
        name, typ, flags, addr, off, size = struct.unpack_from("<IIQQQQ", image, shoff + i * shentsize)
        headers.append((name, typ, addr, off, size))
    strtab_off, strtab_size = headers[shstrndx][3], headers[shstrndx][4]
    strtab = image[strtab_off:strtab_off + strtab_size]
    out = {}
    for name, typ, addr, off, size in headers:
        end = strtab.find(b"\0", name)
        sec_name = strtab[name:end].decode("ascii", "replace")
        if typ != 8:  # SHT_NOBITS has no bytes in the file
            out[sec_name] = (addr, image[off:off + size])
    return out


def uleb(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def sleb(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        done = (v == 0 and not b & 0x40) or (v == -1 and b & 0x40)
        out.append(b | (0 if done else 0x80))
        if done:
            return bytes(out)


def entry(body, pad=True):
    """A length-prefixed CIE/FDE, padded with DW_CFA_nop to 8 bytes."""
    body = bytearray(body)
    while pad and (len(body) + 4) % 8:
        body.append(0)
    return struct.pack("<I", len(body)) + bytes(body)


def eh_cie(aug):
    """GCC's x86-64 CIE: code align 1, data align -8, RA r16, pcrel|sdata4, CFA rsp+8, RA at -8."""
    return entry(struct.pack("<IB", 0, 1) + aug + b"\0" + uleb(1) + sleb(-8) + b"\x10" + uleb(1) +
                 b"\x1b" + bytes([0x0C, 0x07, 0x08, 0x90, 0x01]))


def eh_fde(at, vaddr, start, length, insns):
    field = vaddr + at + 8  # the pc_begin field's address
    return entry(struct.pack("<Iii", at + 4, (start - field), length) + uleb(0) + bytes(insns))


def handmade_eh_frame(vaddr, aug, fdes):
    sec = bytearray(eh_cie(aug))
    for start, length, insns in fdes:
        sec += eh_fde(len(sec), vaddr, start, length, insns)
    return bytes(sec + struct.pack("<I", 0))  # terminator


def handmade(out_dir):
    vaddr = 0x400
    seeds = {
        "handmade.prologue": handmade_eh_frame(vaddr, b"zR", [
            (0x1000, 0x20, [0x41, 0x0E, 0x10, 0x86, 0x02, 0x43, 0x0D, 0x06, 0x58, 0x0C, 0x07, 0x08]),
            (0x2000, 0x10, [0x44, 0x0E, 0x10, 0x0A, 0x42, 0x0E, 0x20, 0x42, 0x0B]),
            (0x2010, 0x10, []),
            (0x3000, 0x30, [0x07, 0x10]),  # outermost frame: RA undefined
        ]),
        "handmade.signal": handmade_eh_frame(vaddr, b"zRS", [
            (0x5000, 0x10, [0x0F, 0x04, 0x77, 0xA0, 0x01, 0x06, 0x10, 0x06, 0x03, 0x77, 0xF8, 0x00,
                            0x10, 0x10, 0x03, 0x77, 0xA8, 0x01]),
        ]),
        "handmade.plt": handmade_eh_frame(vaddr, b"zR", [
            (0x1020, 0x40, [0x0E, 0x10, 0x46, 0x0E, 0x18, 0x4A, 0x0F, 0x0B, 0x77, 0x08, 0x80, 0x00,
                            0x3F, 0x1A, 0x3B, 0x2A, 0x33, 0x24, 0x22]),
            (0x2000, 0x40, [0x0F, 0x03, 0x76, 0x78, 0x06, 0x10, 0x06, 0x02, 0x76, 0x00]),
            (0x3000, 0x10, [0x0C, 0x0A, 0x00, 0x02, 0x04, 0x03, 0x02, 0x00, 0x2E, 0x10,
                            0x11, 0x06, 0x7E, 0x12, 0x07, 0x02, 0x13, 0x7F, 0x14, 0x06, 0x01]),
        ]),
    }
    # .debug_frame, version 4: CIE id 0xffffffff, address and segment sizes, absolute addresses,
    # CIE pointers as section offsets.
    cie = entry(struct.pack("<IB", 0xFFFFFFFF, 4) + b"\0" + bytes([8, 0]) + uleb(1) + sleb(-8) +
                uleb(16) + bytes([0x0C, 0x07, 0x08, 0x90, 0x01]))
    fde = entry(struct.pack("<IQQ", 0, 0x1000, 0x20) + bytes([0x41, 0x0E, 0x10, 0x86, 0x02, 0x43,
                                                             0x0D, 0x06, 0x58, 0x0C, 0x07, 0x08]))
    seeds["handmade.debug_frame"] = cie + fde
    for name, data in seeds.items():
        flag = 1 if name.endswith("debug_frame") else 0
        write(os.path.join(out_dir, "cfi", name), struct.pack("<BI", flag, vaddr) + data)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main():
    out_dir, files = sys.argv[1], sys.argv[2:]
    for sub in ("elf", "cfi"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    handmade(out_dir)
    for path in files:
        name = os.path.basename(path)
        with open(path, "rb") as f:
            image = f.read()
        write(os.path.join(out_dir, "elf", name), image)
        write(os.path.join(out_dir, "cfi", name), image)
        if image[:4] == b"\x7fELF" and image[4] == 2:
            noshdr = bytearray(image)
            struct.pack_into("<Q", noshdr, 0x28, 0)
            struct.pack_into("<HH", noshdr, 0x3C, 0, 0)
            write(os.path.join(out_dir, "elf", name + ".noshdr"), bytes(noshdr))
        for sec_name, flag in ((".eh_frame", 0), (".debug_frame", 1)):
            sec = sections(image).get(sec_name)
            if sec is None:
                continue
            addr, data = sec
            write(os.path.join(out_dir, "cfi", name + sec_name),
                  struct.pack("<BI", flag, addr & 0xFFFFFFFF) + data)


if __name__ == "__main__":
    main()
