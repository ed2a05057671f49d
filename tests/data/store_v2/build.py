"""Write the format-2 fixture beside this script: `python build.py DEST`, with a linpipe that
writes output format 2 (version 0.1.0 up to the merge of the words branch, f3345e1).

It runs what a user ran then: `linpipe model init` (a tiny random DNA model, DEST/model) and
`linpipe submit` of DEST/g.fa (a long record of 3,000 bases of human MT in 3 units, and 300
bases of orangutan MT, packed) to DEST/dna. That linpipe recorded each input as a bare path,
the model by name with `model_sha256`, and a job id made from sampled fingerprints; the tests
hold the current linpipe to reading such a store and to refusing to resume it with one line.
"""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENOMES = HERE.parent / "genomes"


def first_bases(path: Path, n: int) -> tuple[str, str]:
    lines = path.read_text().splitlines()
    return lines[0][1:].split()[0], "".join(lines[1:])[:n]


def build(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    fasta = dest / "g.fa"
    with open(fasta, "w") as f:
        for name, n in (("minimap2_MT-human.fa", 3_000), ("minimap2_MT-orang.fa", 300)):
            rid, seq = first_bases(GENOMES / name, n)
            f.write(f">{rid}\n" + "".join(seq[i:i + 60] + "\n" for i in range(0, len(seq), 60)))
    linpipe = [sys.executable, "-m", "linpipe.cli"]
    subprocess.run(linpipe + ["model", "init", str(dest / "model"), "--d-model", "16", "--n-layers", "1",
                              "--n-heads", "2", "--mlp-hidden", "32", "--seed", "0", "--force"], check=True)
    subprocess.run(linpipe + ["submit", str(fasta), "--model", str(dest / "model"), "--unit-size", "1024",
                              "--workers", "1", "--split", "never", "--quiet", "--out", str(dest / "dna")],
                   check=True)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
