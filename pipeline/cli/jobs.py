"""linpipe status|logs|cancel|list: jobs on a cluster's job server (linpipe.jobs.submission)."""
from __future__ import annotations

import sys

import click

from .common import examples, follow_until_done, job_server_option


def _format_time(t) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _progress_line(out) -> str | None:
    """A job's store progress in words, or None when the store is not readable here."""
    from linpipe.jobs.submission import store_progress

    p = store_progress(out)
    if p is None:
        return None
    return (f"records {p['records_done']}/{p['records']}, positions "
            f"{p['positions_done']:,}/{p['positions']:,} "
            f"({100 * p['positions_done'] / max(p['positions'], 1):.1f}%)"
            + (", complete" if p.get("complete") else ""))


@click.command("status", epilog=examples("linpipe status --address http://HEAD:8265",
                                         "linpipe status lp-3f9c"))
@click.argument("job", required=False)
@job_server_option
def status_cmd(job, address):
    """Status of JOB (a linpipe job id or submission id), or of every linpipe job."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)
    if job is None:
        latest = {j.job_id: j for j in sub.list_jobs(client) if j.job_id}  # oldest first: last wins
        if not latest:
            click.echo(f"no linpipe jobs on {client.get_address()}")
        for j in latest.values():
            prog = _progress_line(j.out)
            click.echo(f"{j.job_id}  {j.status:<9}  {j.submission_id}" + (f"  {prog}" if prog else ""))
        return
    j = sub.find_job(client, job)
    click.echo(f"job:        {j.job_id or '-'}")
    click.echo(f"submission: {j.submission_id}")
    click.echo(f"status:     {j.status}" + (f" ({j.message})" if j.message else ""))
    click.echo(f"started:    {_format_time(j.start_time)}")
    click.echo(f"ended:      {_format_time(j.end_time)}")
    if j.job_id:
        click.echo(f"attempts:   {len(sub.attempts(client, j.job_id))}")
    if j.out:
        click.echo(f"output:     {j.out}")
        click.echo(f"progress:   {_progress_line(j.out) or 'store not readable from this machine yet'}")


@click.command("logs", epilog=examples("linpipe logs lp-3f9c --follow"))
@click.argument("job")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends; exit "
              "with the job's status (0 succeeded, 1 failed, 130 stopped).")
@job_server_option
def logs_cmd(job, follow, address):
    """The log of JOB (its latest attempt)."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)
    j = sub.find_job(client, job)
    if not follow:
        click.echo(sub.logs(client, j.submission_id), nl=False)
        return
    sys.exit(follow_until_done(client, j.submission_id))


@click.command("cancel", epilog=examples("linpipe cancel lp-3f9c"))
@click.argument("job")
@job_server_option
def cancel_cmd(job, address):
    """Stop JOB; its output store stays resumable (submit it again to finish it)."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)
    j = sub.find_job(client, job)
    if j.status in sub.ENDED:
        click.echo(f"{j.submission_id} already ended: {j.status}")
        return
    status = sub.cancel(client, j.submission_id)
    click.echo(f"{j.submission_id} {status}" + ("; submit it again to resume" if j.job_id else ""))


@click.command("list", epilog=examples("linpipe list --address http://HEAD:8265"))
@job_server_option
def list_cmd(address):
    """Every job on the cluster's job server, oldest first."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)
    jobs = sub.list_jobs(client)
    if not jobs:
        click.echo(f"no jobs on {client.get_address()}")
        return
    click.echo(f"{'SUBMISSION':<40} {'STATUS':<10} {'STARTED':<20} ENTRYPOINT")
    for j in jobs:
        ep = j.entrypoint if len(j.entrypoint) <= 60 else j.entrypoint[:57] + "..."
        click.echo(f"{j.submission_id:<40} {j.status:<10} {_format_time(j.start_time):<20} {ep}")
