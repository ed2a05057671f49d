"""The fixed DNA alphabet of model format v1: A=0 C=1 G=2 T=3 N=4 BOS=5."""
import numpy as np

A, C, G, T, N, BOS = 0, 1, 2, 3, 4, 5
VOCAB_SIZE = 6
BASES = "ACGT"  # the four classes the dna head predicts, in token order

# Every IUPAC nucleotide code plus gap/stop symbols; all but ACGT map to N (U, uracil, too:
# the format's alphabet has no U, and reading it as T would invent a base).
IUPAC = set("ACGTNRYKMSWBDHVU-*.")

# byte -> token; 255 marks a byte that is not a valid sequence character.
INVALID = 255
TOKEN_LUT = np.full(256, INVALID, dtype=np.uint8)
for _ch in IUPAC:
    for _c in (_ch, _ch.lower()):
        TOKEN_LUT[ord(_c)] = N
for _tok, _ch in enumerate(BASES):
    TOKEN_LUT[ord(_ch)] = _tok
    TOKEN_LUT[ord(_ch.lower())] = _tok

# byte -> 1 where the base is soft-masked (lowercase letter).
SOFTMASK_LUT = np.zeros(256, dtype=np.uint8)
for _b in range(ord("a"), ord("z") + 1):
    SOFTMASK_LUT[_b] = 1


def tokenize(seq: "bytes | str") -> np.ndarray:
    """Tokens of a sequence string (uint8). Raises ValueError at the first invalid character."""
    if isinstance(seq, str):
        seq = seq.encode("ascii", errors="replace")
    raw = np.frombuffer(seq, dtype=np.uint8)
    tok = TOKEN_LUT[raw]
    bad = np.flatnonzero(tok == INVALID)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"invalid sequence character {chr(raw[i])!r} at offset {i}")
    return tok


# token -> its complement (A<->T, C<->G; N and BOS stay)
COMPLEMENT = np.arange(256, dtype=np.uint8)
COMPLEMENT[[A, C, G, T]] = [T, G, C, A]


def reverse_complement(tokens: np.ndarray) -> np.ndarray:
    """Tokens of the reverse strand read 5'->3': complemented and reversed (a new array)."""
    return COMPLEMENT[np.asarray(tokens)[::-1]]
