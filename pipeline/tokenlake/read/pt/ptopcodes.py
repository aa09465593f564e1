"""The pickle opcode tables that both opcode checks read: the exact scan
(`tokenlake.read.pt.ptcheck`) and its vectorised twin (`tokenlake.read.pt.ptvector`).

Opcodes are named by their byte (pickletools lists them). Each table answers one question the
scans ask of an opcode: how wide it is, whether it carries a length field, a text line, a memo
index, or pushes a value that may be shared without risk.
"""

from __future__ import annotations

SINGLE = b"()]}NR0125abdelostu\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x97\x98Q"
SINGLE = SINGLE.replace(b"2", b"")  # DUP shares the top object: handled one by one
# The width of each opcode a run may hold (0: not one of them). One opcode alone is stepped over
# in Python (a regex call costs more); two or more go to the regex.
WIDTH = [0] * 256
for _op, _w in [
    *zip(b"GMJK\x82\x83\x84", (9, 3, 5, 2, 2, 3, 5), strict=True),
    *((o, 1) for o in SINGLE),
]:
    WIDTH[_op] = _w
COUNTED = {0x55: 1, 0x43: 1, 0x8C: 1, 0x8A: 1, 0x54: 4, 0x42: 4, 0x58: 4, 0x8B: 4}
# One newline-terminated argument (GET as text, `g`, is a memo opcode: see MEMO).
LINE = {ord(c) for c in "ILFSVP"}
TWO_LINES = {ord("c"), ord("i")}  # GLOBAL, INST
# Objects a pickle may reference many times without any risk of amplification: numbers,
# globals and strings of at most SHARED_TEXT bytes (those pushed by the opcodes handled one by
# one; the rest count as not shareable).
ATOMS = set(b"KMJG\x8a\x8bILFN\x88\x89c\x93)")
TEXTS = set(b"XU\x8cTBC\x8d\x8eSV")
SHARED_TEXT = 64
# Integers at least sys.hash_info.modulus (2**61 - 1) in size can be chosen to share one hash:
# n of them as dict keys take n**2 / 2 comparisons (20 000 in 380 KB: 3 s). Dumps hold few.
MAX_HUGE_INTS = 4096
HASH_MODULUS = (1 << 61) - 1
MEMO = {0x71: 1, 0x72: 4, 0x70: 0, 0x68: 1, 0x6A: 4, 0x67: 0, 0x94: 0, 0x32: 0}
GETS = {0x68, 0x6A, 0x67}
PUT_GET = {0x68: 1, 0x71: 1, 0x6A: 4, 0x72: 4}  # BINGET, BINPUT, LONG_BINGET, LONG_BINPUT
