"""`linpipe train`'s settings (TrainConfig), apart from the loop so that the command line reads
their declarations without importing torch."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from linpipe.errors import option


# A field's metadata makes it an option of `linpipe train` (keys as ModelConfig's,
# linpipe.model.config; "metavar" the value's name in the help, "comma_list" for a tuple given
# as ID[,ID...]).
@dataclass(frozen=True)
class TrainConfig:
    steps: int = field(default=1000, metadata={"min": 1, "help": "Total optimizer steps."})
    batch: int = field(default=8, metadata={"min": 1, "help": "Parallel lanes."})
    window: int = field(default=512, metadata={"min": 2, "help": "Positions per lane per step."})
    lr: float = field(default=3e-3, metadata={
        "above": 0, "help": "Peak learning rate (Adam; linear warm-up, then cosine decay to a tenth)."})
    seed: int = field(default=0, metadata={
        "help": "Random seed of the initial weights and the lanes' starting points."})
    # "auto": the first CUDA GPU when there is one, else the CPU
    device: str = field(default="auto", metadata={
        "metavar": "DEVICE", "help": "auto (a CUDA GPU when there is one, else cpu), cpu, cuda, cuda:1, ..."})
    warmup: int = 50  # linear warm-up steps, then cosine decay to lr / 10
    clip: float = 1.0
    checkpoint_every: int = field(default=200, metadata={
        "min": 1, "help": f"Steps between checkpoints in {option('out')}/checkpoint (what {option('resume')} "
                "continues from)."})
    # torch intra-op threads: this model's ops are too small to gain from more
    threads: int = field(default=1, metadata={
        "min": 1, "help": "CPU threads for torch (more rarely helps models this small)."})
    val_fraction: float = 0.05
    val_records: tuple = field(default=(), metadata={
        "comma_list": True, "metavar": "ID[,ID...]",
        "help": "Comma-separated record ids to hold out whole (default: the last 5% of every record)."})
    # positions a lane carries its state over before restarting from BOS; 0: to the record's end
    context: int = field(default=0, metadata={
        "min": 0, "metavar": "N",
        "help": "Positions a lane carries its state over, window to window, before it restarts "
                "from the record-start state (0: to the record's end, as inference does; gradients "
                f"reach back only {option('window')} positions either way)."})

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
