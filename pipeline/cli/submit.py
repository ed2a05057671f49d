"""linpipe submit: run a job here (an embedded local Ray, or joined to a cluster), submit it to a
cluster's job server, or check it (--dry-run). Its options are the job options' declaration
(linpipe.jobs.options); every check before a run is the library's (linpipe.jobs.preflight).
"""
from __future__ import annotations

import contextlib
import sys

import click

from linpipe.jobs.options import OPTIONS

from .common import declared_options, examples, follow_until_done, plural, print_notes


@click.command("submit", epilog=examples(
    "linpipe submit examples/MT-human.fa --out MT-human.zarr",
    "linpipe submit examples/ecg-mitdb100.parquet --model examples/models/ecg "
    "--time-column sample --out ecg.zarr",
    "linpipe submit --spec jobs/assemblies.yaml --dry-run",
    "linpipe submit genome.fa --address http://HEAD:8265 --out /shared/genome.zarr"))
@click.argument("inputs", nargs=-1, required=False, metavar="INPUT...")
@click.option("--spec", "spec", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="A YAML job spec (inputs with globs and any option below, under its name with "
                   "underscores; docs/jobs.md) instead of INPUT...; flags given as well override it.")
@declared_options()
def submit(inputs, spec, **given):
    """Stream INPUT... through a model and write per-position outputs to Zarr, on Ray.

    The same job submitted again resumes where it stopped, or says it is complete.
    """
    from linpipe.jobs.preflight import dry_run
    from linpipe.jobs.request import is_job_server_address
    from linpipe.jobs.spec import build_requests

    reqs, run = build_requests(inputs, spec, {o.name: given[o.name] for o in OPTIONS})
    if run.dry_run:
        for req in reqs:
            _print_dry_run(dry_run(req, run))
        return
    if is_job_server_address(run.address):
        sys.exit(max(_submit_to_job_server(r, run) for r in reqs))
    for req in reqs:
        _run_here(req, run)


def _print_dry_run(report: dict) -> None:
    from linpipe.progress import human_bytes

    click.echo(f"job {report['job_id']} (dry run: nothing was started)")
    print_notes(report["notes"])
    click.echo(f"  inputs:      {len(report['inputs'])} ({', '.join(report['inputs'])})")
    click.echo(f"  records:     {report['records']:,}")
    click.echo(f"  positions:   {report['positions']:,}")
    click.echo(f"  work units:  {report['work_units']:,} of {report['unit_size']:,} positions")
    click.echo(f"  outputs:     {','.join(report['outputs'])}")
    click.echo(f"  output:      {report['out']} (writable)")
    click.echo(f"  est. size:   {human_bytes(report['estimated_output_bytes'])} before compression")
    if report.get("worker_record_bytes"):  # a model that reads each record whole (bidirectional)
        click.echo(f"  per worker:  up to {human_bytes(report['worker_record_bytes'])} kept beside the "
                   "longest record while it runs (in memory up to 2 GiB, else on local disk)")
    whole = report.get("whole_keeps")
    if whole:  # a model that reads each record whole keeps its layers in the store
        from .common import spell

        line = f"  kept layers: up to {human_bytes(whole['most'])} in the store at once (two layers' outputs"
        if whole["not_kept"]:
            line += (f"); none kept for {', '.join(whole['not_kept'])} (over {spell('split_budget')} "
                     f"{human_bytes(whole['budget'])}: a resume runs them from their start)")
        click.echo(line + (")" if not whole["not_kept"] else ""))
    click.echo(f"  cluster:     {report['cluster']}")
    for sp in report.get("splits", ()):
        click.echo(f"  split:       {sp['record']} over {sp['segments']} workers; "
                   f"{sp['passes'] + '; ' if sp.get('passes') else ''}layer inputs: {sp['keeps']}")
    if report["gpu_sharing"]:
        click.echo(f"  GPUs:        {report['gpu_sharing']}")
    if report["complete"]:
        click.echo("  state:       complete; a run would have nothing to do")
    elif report["positions_done"]:
        click.echo(f"  state:       {report['positions_done']:,} positions already done; a run resumes")


def _submit_to_job_server(req, run) -> int:
    """One job submitted detached through the job server; returns the exit status to use."""
    from linpipe.jobs import submission as sub
    from linpipe.jobs.detached import submit_request

    client = sub.connect(run.address)  # first: an unreachable cluster fails in seconds
    outcome = submit_request(client, req, run, notify=lambda line: click.echo(line, err=True))
    job, out = outcome.job_id, req.out_path
    if outcome.action == "complete":
        click.echo(f"Nothing to do: job {job} is complete. Outputs: {out}")
        return 0
    if outcome.action == "running":
        click.echo(f"Job {job} is already running as {outcome.submission_id}; not starting a twin")
    else:
        click.echo(f"Submitted job {job} as {outcome.submission_id} to {client.get_address()}. "
                   f"Outputs: {out}")
    if not run.wait:
        click.echo(f"Follow it: linpipe logs {job} --follow --address {client.get_address()}")
        return 0
    return follow_until_done(client, outcome.submission_id)


def _job_events(quiet: bool = False):
    """The driver's events rendered on stderr: what it is doing, a start line, a progress bar or
    log lines (quiet: only what goes wrong)."""
    import time

    from linpipe.jobs.driver import JobEvents
    from linpipe.progress import Progress

    class CliEvents(JobEvents):
        progress = None

        def preparing(self, address):
            if not quiet:
                where = f"joining the Ray cluster at {address}" if address else "starting a local Ray"
                click.echo(f"{where} and its workers (the model loads on each; this takes seconds)...",
                           err=True)

        def started(self, s):
            if not quiet:
                print_notes(s.notes)
            if not s.work_items or quiet:
                return  # nothing to do: the summary line says so, once
            why = ""
            if s.workers_possible > s.workers:
                why = (f" ({s.workers_possible} possible, but a record's units run in order on one worker "
                       "and short records run together: one worker per work item)")
            if s.per_gpu > 1:
                why += f" ({s.per_gpu} per GPU)"
            left = s.positions - s.positions_done
            click.echo(f"job {s.job_id}: {plural(s.records, 'record')}, {_positions(s.positions, s.strands)} "
                       f"({left:,.0f} to run) in {plural(s.work_items, 'work item')}, "
                       f"on {plural(s.workers, 'worker')}{why}; outputs -> {s.out}", err=True)
            self.progress = Progress(s.positions, done=s.positions_done)
            if s.strands > 1:
                self.progress.note = "both strands"

        def workers_ready(self):
            if self.progress is not None:
                self.progress.t0 = time.monotonic()  # rates count from the first worker ready

        def unit_done(self, result, units_done):
            if self.progress is not None:
                self.progress.update(result.positions * result.share)

        def split_progress(self, record_id, positions):
            if self.progress is not None:
                self.progress.update(positions)

        def split_resumed(self, record_id, positions):
            if self.progress is not None:
                self.progress.skip(positions)

        def split_keeps(self, record_id, keeps, rates):
            if not quiet:
                click.echo(f"record {record_id} split; layer inputs: {keeps.describe()} (rates "
                           f"{rates.source})", err=True)

        def worker_died(self, node, error):
            click.echo(f"worker {node} died ({error}); its work resumes from the last boundary state "
                       "on another worker", err=True)

        def finished(self):
            if self.progress is not None:
                self.progress.close()

        def waiting(self, owner):
            from linpipe.jobs.lease import holder

            click.echo(f"job {owner.get('job_id')} is already running ({holder(owner)}); "
                       "waiting for it to end", err=True)

    return CliEvents()


def _positions(n: int, strands: int) -> str:
    """A job's positions in words; on both strands a position is done once both strands ran it."""
    return f"{n:,} positions" + (" on both strands" if strands > 1 else "")


def _run_here(req, run):
    """One job with its driver in this process (an embedded local Ray, or joined to a cluster)."""
    from linpipe.jobs.driver import run_job
    from linpipe.progress import human_bytes, human_count, human_time

    # stdout holds the summary alone: Ray prints what its raylets report (a worker's death) on
    # the driver's stdout, from a thread of its own, while the job runs.
    with contextlib.redirect_stdout(sys.stderr):
        s = run_job(req, address=run.address, events=_job_events(run.quiet), wait=run.wait,
                    force_takeover=run.force_takeover)
    if s.nothing_to_do:
        click.echo(f"Nothing to do: job {s.job_id} is complete. Outputs: {s.out}")
        return
    before = f", {human_count(s.positions_resumed)} from before" if s.positions_resumed else ""
    click.echo(f"Done: job {s.job_id}: {plural(s.records, 'record')}, {_positions(s.positions, s.strands)} "
               f"({human_count(s.positions_run)} run{before}) in {human_time(s.seconds)} "
               f"({human_count(s.positions_per_s)} positions/s on {plural(s.workers, 'worker')}; "
               f"start-up {s.startup_s:.1f} s), {human_bytes(s.output_bytes)} written.")
    busy = s.read_s + s.model_s + s.write_s
    if busy > 0:
        click.echo(f"Worker time: read {100 * s.read_s / busy:.0f}%, model {100 * s.model_s / busy:.0f}%, "
                   f"write {100 * s.write_s / busy:.0f}%; peak memory: driver "
                   f"{human_bytes(s.driver_peak_rss)}, largest worker {human_bytes(s.worker_peak_rss)}.")
    click.echo(f"Outputs: {s.out}")
