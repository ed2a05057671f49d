"""What `linpipe status|logs|cancel|list` (and submit's job-server branch) print.

Kept out of cli.py so the Click commands stay thin; everything raises LinpipeError for the
CLI to print as one line.
"""
from __future__ import annotations

import click

from . import submission as sub


def _progress_line(out: str | None) -> str | None:
    p = sub.store_progress(out)
    if p is None:
        return None
    return (f"records {p['records_done']}/{p['records']}, positions "
            f"{p['positions_done']:,}/{p['positions']:,} "
            f"({100 * p['positions_done'] / max(p['positions'], 1):.1f}%)"
            + (", complete" if p.get("complete") else ""))


def print_status(job: str | None, address: str | None) -> None:
    client = sub.connect(address)
    if job is None:
        jobs = [j for j in sub.list_jobs(client) if j.job_id]
        latest = {j.job_id: j for j in jobs}  # oldest first, so the last attempt wins
        if not latest:
            click.echo(f"no linpipe jobs on {client.get_address()}")
        for j in latest.values():
            prog = _progress_line(j.out)
            click.echo(f"{j.job_id}  {j.status:<9}  {j.submission_id}"
                       + (f"  {prog}" if prog else ""))
        return
    j = sub.find_job(client, job)
    click.echo(f"job:        {j.job_id or '-'}")
    click.echo(f"submission: {j.submission_id}")
    click.echo(f"status:     {j.status}" + (f" ({j.message})" if j.message else ""))
    click.echo(f"started:    {sub.format_time(j.start_time)}")
    click.echo(f"ended:      {sub.format_time(j.end_time)}")
    if j.job_id:
        n = len(sub.attempts(client, j.job_id))
        click.echo(f"attempts:   {n}")
    if j.out:
        click.echo(f"output:     {j.out}")
        prog = _progress_line(j.out)
        click.echo(f"progress:   {prog or 'store not readable from this machine yet'}")


def print_logs(job: str, address: str | None, follow: bool) -> int:
    client = sub.connect(address)
    j = sub.find_job(client, job)
    if not follow:
        click.echo(sub.logs(client, j.submission_id), nl=False)
        return 0
    return follow_until_done(client, j.submission_id)


def follow_until_done(client, submission_id: str) -> int:
    """Stream the log, then exit with the job's status (0 only if it succeeded)."""
    for chunk in sub.follow_logs(client, submission_id):
        click.echo(chunk, nl=False)
    status = sub.wait(client, submission_id, timeout=30)
    click.echo(f"job {submission_id} {status}", err=True)
    return sub.exit_code(status)


def cancel_job(job: str, address: str | None) -> None:
    client = sub.connect(address)
    j = sub.find_job(client, job)
    if j.status in sub.ENDED:
        click.echo(f"{j.submission_id} already ended: {j.status}")
        return
    status = sub.cancel(client, j.submission_id)
    click.echo(f"{j.submission_id} {status}"
               + ("; submit it again to resume" if j.job_id else ""))


def print_list(address: str | None) -> None:
    client = sub.connect(address)
    jobs = sub.list_jobs(client)
    if not jobs:
        click.echo(f"no jobs on {client.get_address()}")
        return
    click.echo(f"{'SUBMISSION':<40} {'STATUS':<10} {'STARTED':<20} ENTRYPOINT")
    for j in jobs:
        ep = j.entrypoint if len(j.entrypoint) <= 60 else j.entrypoint[:57] + "..."
        click.echo(f"{j.submission_id:<40} {j.status:<10} {sub.format_time(j.start_time):<20} "
                   f"{ep}")
