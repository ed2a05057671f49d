"""Cut the public genomes and series down to the subset in tests/data (see README.md here).

    python tests/data/cut.py SRC [DST]

SRC holds the full files in genomes/ and timeseries/ (the layout LINPIPE_TEST_DATA points at);
DST defaults to this folder. Every cut keeps the file's name, format and quirks: a prefix of each
record or row range, the original header lines, line widths and line endings.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

# record id -> bases kept; None keeps the record whole
ATHALIANA_BASES = {"Chr2": 90_000}  # the IUPAC codes sit at 85,780-86,535
ATHALIANA_OTHER = 30_000  # the other N runs all start within the first 28,150 bases
# per contig: all 42 contigs stay, the small ones whole; bases 100,000-200,000 of the largest
# are the held-out slice test_default_model scores
SEPIDERMIDIS_BASES = {"LGJG01000042": 200_000}
SEPIDERMIDIS_OTHER = 8_000
ECG_ROWS = 40_000
PPG3_LAST_ROWS = 10_000  # the file's last rows: its missing final newline stays
# hg19 chr1 stays whole: test_default_model reads its last 5%, the default model's validation part
WHOLE = ["htslib_ce.fa", "korflab_hg19_chr1_first3Mb.fa.gz", "minimap2_MT-human.fa", "minimap2_MT-orang.fa"]
# heartpy_data2 whole: the held-out series of the default-timeseries model (issue 17)
WHOLE_SERIES = ["heartpy_data2_ppg.csv", "statsmodels_co2_weekly.csv", "statsmodels_mstl_elec_vic.csv",
                "statsmodels_sunspots_yearly.csv"]


def cut_fasta(text: str, keep) -> str:
    """The first keep(record id) bases of every record, rewrapped at the record's own width."""
    out = []
    for block in text.split(">")[1:]:
        header, _, body = block.partition("\n")
        lines = body.split()
        width = len(lines[0])
        seq = "".join(lines)[:keep(header.split()[0])]
        out.append(">" + header + "\n")
        out.extend(seq[i:i + width] + "\n" for i in range(0, len(seq), width))
    return "".join(out)


def main(src: Path, dst: Path) -> None:
    import pyarrow.parquet as pq
    from Bio import bgzf

    g, t = src / "genomes", src / "timeseries"
    (dst / "genomes").mkdir(parents=True, exist_ok=True)
    (dst / "timeseries").mkdir(parents=True, exist_ok=True)
    for name in WHOLE:
        shutil.copyfile(g / name, dst / "genomes" / name)

    ath = cut_fasta((g / "korflab_Athaliana_TAIR_1pct.fa").read_text(),
                    lambda rid: ATHALIANA_BASES.get(rid, ATHALIANA_OTHER))
    (dst / "genomes" / "korflab_Athaliana_TAIR_1pct.fa").write_text(ath)

    asm = cut_fasta((g / "abricate_Sepidermidis_ST14_assembly.fa").read_text(),
                    lambda rid: SEPIDERMIDIS_BASES.get(rid, SEPIDERMIDIS_OTHER))
    (dst / "genomes" / "abricate_Sepidermidis_ST14_assembly.fa").write_text(asm)
    with bgzf.BgzfWriter(dst / "genomes" / "abricate_Sepidermidis_ST14_assembly.fa.bgz", "wb") as f:
        f.write(asm.encode())

    ecg = pq.read_table(t / "mitdb_100_ecg.parquet").slice(0, ECG_ROWS)
    pq.write_table(ecg, dst / "timeseries" / "mitdb_100_ecg.parquet", compression="zstd")

    rows = (t / "heartpy_data3_ppg.csv").read_bytes().split(b"\r\n")
    rows = rows[:1] + rows[-PPG3_LAST_ROWS:]
    (dst / "timeseries" / "heartpy_data3_ppg.csv").write_bytes(b"\r\n".join(rows))
    for name in WHOLE_SERIES:
        shutil.copyfile(t / name, dst / "timeseries" / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parent)
