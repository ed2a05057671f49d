"""Every option of a job, declared once (OPTIONS), and how its values are written and read.

One declaration per option gives its name, kind, default, help, whether it enters the job's
identity and where a store records it. From it come JobRequest's fields and RunOptions'
(request.py), `linpipe submit`'s options (linpipe.cli builds them), a spec file's keys
(spec.py), the argv sent to a job server (JobRequest.argv), the store's recorded options
(`recorded`, `stored_values`), the job id's options (`identity`) and the table in
docs/jobs.md (tests/test_options.py checks it).

One name per option: the JobRequest field, the library keyword and the spec key; the flag is
the name with dashes. `aliases` are older names (each still a flag and a spec key),
`spec_aliases` older spec keys (dotted: a key inside a mapping, as in `timeseries.id_column`).

Each kind parses text (a flag, or a string in a spec) and a spec's YAML value in one place; a
bad value raises InvalidValue, whose message names no option: each front end says which.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from linpipe.errors import LinpipeError
from linpipe.strands import BOTH, CHOICES, ONLY_FORWARD

# Positions per work unit (and per Zarr chunk along positions). Measured (BENCHMARKS.md, "Pipeline"):
# large enough that per-call overhead is lost in the model time, small enough that a genome
# still splits into many units and a worker's memory stays small.
DEFAULT_UNIT_SIZE = 262_144

SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
SPLIT_CHOICES = ("auto", "never")


class InvalidValue(LinpipeError):
    """A value an option cannot take. `key`: the part of a mapping value that is wrong."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def parse_size(text: str) -> int | None:
    """Bytes in a size such as 4GiB, 512MB or 1024; None when it is not one."""
    m = SIZE.match(text)
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper().rstrip("B")]) if m else None


def _number(name: str, value: Any) -> float | int:
    """A non-negative amount of a resource, from text or a number."""
    if isinstance(value, bool):
        raise InvalidValue(f"{name}={value!r} is not a number", key=name)
    try:
        amount = float(value)
    except (TypeError, ValueError):
        raise InvalidValue(f"{name}={value!r} is not a number", key=name) from None
    if amount < 0:
        raise InvalidValue(f"{name} must not be negative, not {value}", key=name)
    return int(amount) if amount.is_integer() else amount


def actors_per_gpu(num_gpus: float | None) -> int:
    """How many actors asking for `num_gpus` each share one GPU: 1/num_gpus rounded down for a
    fraction (Ray places that many on a GPU), 1 for a whole GPU or more, 0 for none."""
    if not num_gpus:
        return 0
    return max(1, int(1 / num_gpus + 1e-9)) if num_gpus < 1 else 1


def gpu_sharing(num_gpus: float | None) -> str | None:
    """What `num_gpus` per actor means on a GPU cluster, in words (None when it is none)."""
    if not num_gpus:
        return None
    if num_gpus >= 1:
        gpus = f"{num_gpus:g} GPU{'s' if num_gpus > 1 else ''}"
        return f"num_gpus={num_gpus:g}: each actor has {gpus} of its own"
    n = actors_per_gpu(num_gpus)
    return f"num_gpus={num_gpus:g}: {n} actors share each GPU"


@dataclass(frozen=True)
class ActorResources:
    """What each worker actor asks Ray for. Empty: the driver's default (one GPU and one CPU
    per actor on GPU clusters, else one CPU)."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: int | None = None  # bytes
    custom: tuple[tuple[str, float], ...] = ()  # custom Ray resources, sorted by name

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.num_cpus, self.num_gpus, self.memory)) or bool(self.custom)

    def ray_options(self) -> dict[str, Any]:
        """The options for ray.remote(...).options(): the one place these become Ray's names."""
        opts = {k: v for k, v in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus),
                                  ("memory", self.memory)) if v is not None}
        if self.custom:
            opts["resources"] = dict(self.custom)
        return opts

    def gpu_sharing(self) -> str | None:
        """How the actors meet the GPUs, in words (None when they ask for none)."""
        return gpu_sharing(self.num_gpus)

    def text(self) -> str:
        """As parse() takes it (parse(text()) gives these resources back)."""
        pairs = [f"{k}={v}" for k, v in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus),
                                         ("memory", self.memory)) if v is not None]
        return ",".join(pairs + [f"{k}={v}" for k, v in self.custom])

    @classmethod
    def parse(cls, text: str) -> ActorResources:
        """num_cpus=2,memory=4GiB,my_accel=1: the flag's form (a spec may give it too)."""
        items = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise InvalidValue(f"{item!r} is not KEY=VALUE")
            items[name.strip()] = value.strip()
        return cls.from_mapping(items, custom_inline=True)

    @classmethod
    def from_mapping(cls, items: dict, custom_inline: bool = False) -> ActorResources:
        """{num_cpus, num_gpus, memory, custom: {name: amount}}: a spec's mapping form (custom
        resources inline, as the flag writes them, with custom_inline)."""
        found: dict[str, Any] = {}
        custom: dict[str, float] = {}
        for name, value in items.items():
            if name == "memory":
                size = value if isinstance(value, int) and not isinstance(value, bool) else (
                    parse_size(value) if isinstance(value, str) else None)
                if size is None:
                    raise InvalidValue(f"memory={value!r} is not a size such as 4GiB or 512MB", key=name)
                found["memory"] = size
            elif name in ("num_cpus", "num_gpus"):
                found[name] = _number(name, value)
            elif custom_inline:
                custom[name] = _number(name, value)
            elif name == "custom":
                if not isinstance(value, dict):
                    raise InvalidValue(f"must be a mapping of custom Ray resource names to amounts, "
                                       f"not {value!r}", key=name)
                custom.update({str(k): _number(f"custom.{k}", v) for k, v in value.items()})
            else:
                raise InvalidValue(unknown_key(name, RESOURCE_KEYS), key=name)
        return cls(**found, custom=tuple(sorted(custom.items())))


RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "custom")


def unknown_key(key: str, known) -> str:
    """Why a key is refused, with the closest known one (a typo) or the list of them. `known`: the
    keys, or a mapping of each key to the name to suggest for it (for an older name, the new one)."""
    import difflib

    names = known if isinstance(known, dict) else {k: k for k in known}
    close = difflib.get_close_matches(str(key), list(names), n=1, cutoff=0.6)
    return "unknown key" + (f" (did you mean {names[close[0]]}?)" if close
                            else f"; known keys: {', '.join(dict.fromkeys(names.values()))}")


# ---------------------------------------------------------------------------------- kinds
class Kind:
    """How an option's value is written: as text (a flag, or a string in a spec), as YAML, and
    back as text for argv. `types`: the YAML types a spec may give; `what`: them in words."""

    types: tuple[type, ...] = (str,)
    what = "a string"
    flag = False  # a flag without a value (on when given)
    multiple = False  # a flag given once per value

    def parse(self, text: str) -> Any:
        return text

    def from_yaml(self, value: Any) -> Any:
        """A spec's value (already one of `types`)."""
        return self.parse(value) if isinstance(value, str) else value

    def coerce(self, value: Any) -> Any:
        """A library caller's value: text is parsed, anything else taken as it is."""
        return self.parse(value) if isinstance(value, str) else value

    def text(self, value: Any) -> str:
        return str(value)

    def yaml(self, value: Any) -> Any:
        """The value as a spec writes it (what from_yaml reads back)."""
        return self.text(value)


class Text(Kind):
    pass


class Count(Kind):
    """A positive integer."""

    types = (int, str)
    what = "a positive integer"

    def parse(self, text: str) -> int:
        try:
            n = int(str(text).strip())
        except ValueError:
            raise InvalidValue(f"must be {self.what}, not {text!r}") from None
        return self.from_yaml(n)

    def from_yaml(self, value: Any) -> int:
        if isinstance(value, str):
            return self.parse(value)
        if value < 1:
            raise InvalidValue(f"must be {self.what}, not {value}")
        return value

    def yaml(self, value: int) -> int:
        return value


class Flag(Kind):
    types = (bool,)
    what = "true or false"
    flag = True

    def parse(self, text: str) -> bool:
        if text.strip().lower() not in ("true", "false"):
            raise InvalidValue(f"must be {self.what}, not {text!r}")
        return text.strip().lower() == "true"

    def yaml(self, value: bool) -> bool:
        return value


class Choice(Kind):
    def __init__(self, *choices: str):
        self.choices = choices
        self.what = " or ".join(choices)

    def parse(self, text: str) -> str:
        if text not in self.choices:
            raise InvalidValue(f"expected {self.what}, not {text!r}")
        return text


class Names(Kind):
    """Names separated by commas (a spec may give a list); a tuple. unordered: a set of names
    whose order means nothing (the identity sorts them)."""

    types = (list, str)
    what = "a list of names"

    def __init__(self, unordered: bool = False):
        self.unordered = unordered

    def parse(self, text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(","))
        if not all(names):
            raise InvalidValue(f"must be names separated by commas, not {text!r}")
        return names

    def from_yaml(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            return self.parse(value)
        if not value or any(not isinstance(x, (str, int)) or isinstance(x, bool) or not str(x).strip()
                            for x in value):
            raise InvalidValue(f"must be {self.what}, not {value!r}")
        return tuple(str(x).strip() for x in value)

    def coerce(self, value: Any) -> tuple[str, ...]:
        return self.parse(value) if isinstance(value, str) else tuple(value)

    def text(self, value) -> str:
        return ",".join(value)

    def yaml(self, value) -> list[str]:
        return list(value)

    def canonical(self, value) -> list[str]:
        return sorted(value) if self.unordered else list(value)


class Entries(Kind):
    """A flag given once per entry (KEY=VALUE pairs, checked where they are used); a tuple."""

    types = (list, str)
    what = "a list of KEY=VALUE entries"
    multiple = True

    def from_yaml(self, value: Any) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) else value
        if any(not isinstance(x, str) for x in items):
            raise InvalidValue(f"must be {self.what}, not {value!r}")
        return tuple(items)

    def coerce(self, value: Any) -> tuple[str, ...]:
        return self.from_yaml(value)

    def yaml(self, value) -> list[str]:
        return list(value)


class Split(Kind):
    """auto, never or a number N >= 1 of segments (1 means never)."""

    types = (str, int)
    what = "auto, never or a number of segments"

    def parse(self, text: str) -> str | int:
        v = str(text).strip().lower()
        if v.isdigit():
            return self.from_yaml(int(v))
        if v not in SPLIT_CHOICES:
            raise InvalidValue(f"expected {self.what}, got {text!r}")
        return v

    def from_yaml(self, value: Any) -> str | int:
        if isinstance(value, str):
            return self.parse(value)
        if value < 1:
            raise InvalidValue(f"N must be at least 1, got {value}")
        return value

    def yaml(self, value):
        return value


class Size(Kind):
    """A number of bytes: 4GiB, 512MB, 1024 or 0."""

    types = (int, str)
    what = "a size such as 8GiB, 512MB or 0"

    def parse(self, text: str) -> int:
        n = parse_size(str(text).strip())
        if n is None:
            raise InvalidValue(f"must be {self.what}, not {text!r}")
        return n

    def from_yaml(self, value: Any) -> int:
        if isinstance(value, str):
            return self.parse(value)
        if isinstance(value, bool) or value < 0:
            raise InvalidValue(f"must be {self.what}, not {value!r}")
        return int(value)

    def yaml(self, value: int) -> int:
        return value


class Resources(Kind):
    """What each actor asks Ray for: num_cpus=2,memory=4GiB,NAME=1, or a spec's mapping."""

    types = (dict, str)
    what = "KEY=VALUE pairs or a mapping with num_cpus, num_gpus, memory, custom"

    def parse(self, text: str) -> ActorResources:
        return ActorResources.parse(text)

    def from_yaml(self, value: Any) -> ActorResources:
        return self.parse(value) if isinstance(value, str) else ActorResources.from_mapping(value)

    def coerce(self, value: Any) -> ActorResources:
        return value if isinstance(value, ActorResources) else self.from_yaml(value)

    def text(self, value: ActorResources) -> str:
        return value.text()


# ---------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Option:
    """One option of `linpipe submit` and of a spec file."""

    name: str
    kind: Kind
    help: str
    default: Any = None
    default_text: str | None = None  # the default in words, where its value does not say it
    metavar: str | None = None
    example: Any = None  # a value as a spec writes it (docs; tests round-trip it)
    run: bool = False  # how this submit runs (RunOptions), not what the job is (JobRequest)
    identity: bool = False  # it changes the outputs: it enters the job id
    identity_key: str | None = None  # its key in the job id, where not its name (ids stay as they were)
    input_option: bool = False  # an open_input keyword (time series)
    stored: str | None = None  # where a store's metadata records it (dotted: inside a mapping)
    path: bool = False  # a file: relative to a spec's folder there, absolute in argv
    aliases: tuple[str, ...] = ()  # older names, each still a flag and a spec key
    spec_aliases: tuple[str, ...] = ()  # older spec keys (dotted: inside a mapping)
    short: str | None = None  # a one-letter flag

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> list[str]:
        """Every flag that gives this option, its own first."""
        return [self.flag, *("--" + a.replace("_", "-") for a in self.aliases),
                *([f"-{self.short}"] if self.short else [])]

    def argv(self, value: Any) -> list[str]:
        """The flags that give `value` back (nothing for the default)."""
        if value == self.default or value is None:
            return []
        if self.kind.flag:
            return [self.flag]
        if self.kind.multiple:
            return [a for v in value for a in (self.flag, v)]
        return [self.flag, self.kind.text(value)]


_TS = "Time series: "
OPTIONS: tuple[Option, ...] = (
    Option("model", Text(), "Model directory or shipped model name.", default="default",
           metavar="DIR|NAME", example="default-timeseries", stored="model"),
    Option("out", Text(), "Output Zarr store (a path or an fsspec URL; in a spec with per_input, "
           "{stem} or {name} of each input).", default_text="INPUTNAME.zarr in the current directory",
           metavar="PATH", example="results/genome.zarr", path=True),
    Option("unit_size", Count(), "Positions per work unit: what one worker call reads, runs and writes "
           "(one Zarr chunk along positions).", default=DEFAULT_UNIT_SIZE, metavar="N", example=65536,
           identity=True, identity_key="chunk_size", stored="chunk_size", aliases=("chunk_size",)),
    Option("outputs", Names(unordered=True), "Comma-separated outputs, e.g. "
           "logprob,entropy,softmask,logprob_acgt,hidden (docs/output-format.md).",
           default_text="the modality's defaults", metavar="LIST", example=["logprob", "entropy"],
           identity=True, stored="outputs"),
    Option("id_column", Text(), _TS + "column whose value names the series (record) of each row.",
           metavar="COL", example="sensor", identity=True, input_option=True,
           stored="input_options.id_column", spec_aliases=("timeseries.id_column",)),
    Option("time_column", Text(), _TS + "the time column (kept as the time coordinate; not a channel).",
           metavar="COL", example="sample", identity=True, input_option=True,
           stored="input_options.time_column", spec_aliases=("timeseries.time_column",)),
    Option("columns", Names(), _TS + "comma-separated channel columns (in the model's channel order "
           "when a model reads them).", default_text="every numeric column but the time and id columns",
           metavar="LIST", example=["MLII_mV", "V5_mV"], identity=True, input_option=True,
           stored="input_options.columns", spec_aliases=("timeseries.columns",)),
    Option("time_format", Text(), "CSV: how the time column writes dates, in strptime codes, e.g. "
           "'%d.%m.%Y %H:%M'.", default_text="ISO 8601 and forms such as 2010/01/01 00:00",
           metavar="FORMAT", example="%d.%m.%Y %H:%M", identity=True, input_option=True,
           stored="input_options.time_format", spec_aliases=("timeseries.time_format",)),
    Option("sort", Flag(), _TS + "sort each series' rows by time (a sorted copy in linpipe's cache "
           "folder) instead of refusing rows out of time order.", default=False, example=True,
           identity=True, input_option=True, stored="input_options.sort"),
    Option("index_in_cache", Flag(), "Keep the inputs' index files (.fai, .gzi, .lpi) in linpipe's cache "
           "folder ($LINPIPE_CACHE, else ~/.cache/linpipe), never beside the inputs (as "
           "$LINPIPE_INDEX_IN_CACHE=1 does for every command).",
           default=False, default_text="beside an input in a folder of the user's, else in the cache",
           example=True, input_option=True, stored="input_options.index_in_cache"),
    Option("strand", Choice(*CHOICES), "both: also the reverse strand, as logprob_rc, "
           "entropy_rc (logprob_acgt_rc, hidden_rc) at the forward positions (DNA; docs/strands.md).",
           default=ONLY_FORWARD,
           example=BOTH, identity=True),
    Option("context", Count(), "A model that reads the whole record on both sides (caduceus): read each "
           "record in windows of W positions instead, as windowed pipelines of such models do (windows "
           "stepping by W/2, the last flush with the record's end, each position from the window whose "
           "centre it lies nearest; docs/models.md). Such a store keeps no whole-record states: "
           "score-variants refuses it.", default_text="the whole record", metavar="W", example=512,
           identity=True, stored="context"),
    Option("regions", Text(), "Store outputs only inside these regions (BED, 0-based); records with a "
           "region are still streamed from their start, so the context is exact (docs/regions.md).",
           metavar="BED", example="regions.bed", identity=True,
           stored="regions.path", path=True),
    Option("regions_lenient", Flag(), "With regions: skip BED lines whose contig is not in the inputs "
           "and clip intervals at a record's end (both counted and printed) instead of refusing the file "
           "(a genome-wide BED over a subset of contigs).", default=False, example=True,
           stored="regions.lenient"),
    Option("split", Split(), "Run one long record over several workers at once (exact sequence "
           "parallelism, docs/sequence-parallel.md): auto splits a record much longer than the job's "
           "share per worker; N forces N segments; never streams every record on one worker (auto: "
           "CPU actors and DNA models only; GPU actors, time series and regions stream).",
           default="auto", metavar="auto|never|N", example=4),
    Option("split_budget", Size(), "Bytes of layer inputs a split record may keep in the output store "
           "while it runs, so that a killed job resumes near where it stopped (they are deleted when the "
           "record is written); per layer the split keeps its input or recomputes it on resume, by "
           "expected cost on rates measured on the machine (one run in fifty assumed resumed; "
           "$LINPIPE_SPLIT_KILL_RATE); a bidirectional model's record keeps each layer's output where two "
           "fit; 0 keeps none (docs/sequence-parallel.md, \"Surviving a kill\").",
           default_text="8GiB", metavar="BYTES", example="2GiB"),
    Option("workers", Count(), "Worker actors (CPU slots of the local Ray).",
           default_text="one per CPU, or per GPU", metavar="N", example=2),
    Option("actor_resources", Resources(), "What each worker actor asks Ray for, e.g. "
           "num_cpus=2,num_gpus=1,memory=4GiB or a custom resource name=amount; the driver starts as "
           "many actors as the cluster's totals hold (at most workers), each with num_cpus torch "
           "threads on CPU (a spec may give a mapping with num_cpus, num_gpus, memory, custom).",
           default=ActorResources(), default_text="1 GPU each on GPU clusters, else 1 CPU",
           metavar="LIST", example="num_cpus=2,memory=4GiB", spec_aliases=("resources",)),
    Option("overwrite", Flag(), "Replace an existing store of a different job.", default=False,
           example=True),
    Option("address", Text(), "Ray cluster: HOST:PORT of the head (the driver runs here), or "
           "http://HEAD:8265 to submit through the job server and return at once.",
           default_text="an embedded local Ray", metavar="ADDR", example="http://127.0.0.1:8265",
           run=True),
    Option("wait", Flag(), "With a job server address: follow the job's log until it ends; exit with "
           "its status. Otherwise, when another driver is running this job: wait until it ends, then "
           "finish (or report) the job instead of refusing.", default=False, example=True, run=True),
    Option("force_takeover", Flag(), "Take the job's lease from the driver that holds it (one that is "
           "gone, without waiting for its lease to expire); that driver, if alive, stops.",
           default=False, example=True, run=True),
    Option("runtime_env", Text(), "With a job server address: a runtime_env YAML (pip, env_vars) for "
           "the job.", metavar="FILE", example="env.yaml", run=True, path=True),
    Option("env", Entries(), "With a job server address: an environment variable for the job, "
           "KEY=VALUE (repeatable; a spec gives a list).", default=(), metavar="KEY=VALUE",
           example=["OMP_NUM_THREADS=1"], run=True),
    Option("dry_run", Flag(), "Check inputs, model, output location and cluster; print the plan "
           "(records, positions, work units, estimated output size); run nothing.", default=False,
           example=True, run=True),
    Option("quiet", Flag(), "No start-up, start line or progress on stderr; only the summary and errors.",
           default=False, example=True, run=True, short="q"),
)
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
REQUEST_OPTIONS = tuple(o for o in OPTIONS if not o.run)
RUN_OPTIONS = tuple(o for o in OPTIONS if o.run)


def identity(values: dict[str, Any]) -> dict[str, Any]:
    """The options part of a job id (plan.job_id): what the identity options planned to, by
    name (an input option as open_input takes it, regions as their digest); an option whose
    effect another one carries is left out (strand: the outputs it adds)."""
    doc: dict[str, Any] = {"input_options": {}}
    for o in OPTIONS:
        v = values.get(o.name)
        if not o.identity or v is None:
            continue
        if o.input_option:
            doc["input_options"][o.name] = v
        else:
            doc[o.identity_key or o.name] = o.kind.canonical(v) if isinstance(o.kind, Names) else v
    return doc


def recorded(values: dict[str, Any]) -> dict[str, Any]:
    """A store's recorded options (its metadata), in the declaration's order: each given value at
    its `stored` place; the input options' mapping always (empty when none was given), its
    entries in the order of `values`. Every name is a declared option's: one that is not (a
    misspelt name would be a value the store silently never records) raises KeyError."""
    unknown = [name for name in values if name not in BY_NAME]
    if unknown:
        raise KeyError(f"not a declared job option: {', '.join(unknown)}")
    meta: dict[str, Any] = {}
    for o in OPTIONS:
        head, _, tail = (o.stored or "").partition(".")
        if o.input_option:
            meta.setdefault(head, {})
        elif o.stored and values.get(o.name) is not None:
            if tail:
                meta.setdefault(head, {})[tail] = values[o.name]
            else:
                meta[head] = values[o.name]
    for name, v in values.items():
        if BY_NAME[name].input_option and v is not None:
            head, _, tail = BY_NAME[name].stored.partition(".")
            meta[head][tail] = v
    return meta


def stored_values(meta: dict[str, Any]) -> dict[str, Any]:
    """The options a store recorded, by name, as a JobRequest takes them (recorded's inverse)."""
    found = {}
    for o in OPTIONS:
        if o.stored is None:
            continue
        v: Any = meta
        for part in o.stored.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None:
            found[o.name] = o.kind.coerce(v)
    return found
