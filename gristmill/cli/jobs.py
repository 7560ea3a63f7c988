"""``gristmill jobs``: submit a JSONL file, watch it, fetch its results."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import typer
from gristmill_client import Client, GristmillHTTPError
from tqdm import tqdm

app = typer.Typer(
    help="Async batch jobs (uses GRISTMILL_URL / GRISTMILL_API_KEY).", no_args_is_help=True
)


def _client() -> Client:
    try:
        return Client.from_env(timeout_s=600)
    except RuntimeError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from exc


def _show(j: dict[str, object]) -> None:
    typer.echo(json.dumps({k: v for k, v in j.items() if k != "items"}, indent=2))


def _watch(client: Client, job_id: str, total: int) -> dict[str, object]:
    with tqdm(total=total, desc="running", unit="item") as bar:

        def progress(j: dict[str, object]) -> None:
            c = j["counts"]
            assert isinstance(c, dict)
            bar.set_postfix(status=j["status"], failed=c["failed"])
            bar.update(c["total"] - c["queued"] - bar.n)

        return client.wait(job_id, poll_s=1.0, on_progress=progress)


@app.command()
def submit(
    file: Path,
    model: str = typer.Option(..., help="model name or name@version"),
    params: str | None = typer.Option(None, help="model params as a JSON object"),
    completion_window_s: int | None = None,
    webhook_url: str | None = None,
    base: str | None = typer.Option(
        None, help="a finished job whose results items with unchanged content reuse"
    ),
    wait: bool = typer.Option(False, "--wait", help="wait for the job to finish"),
) -> None:
    """Submit a JSONL file (one {"input": ..., "custom_id"?: ...} per line)."""
    client = _client()
    size = file.stat().st_size
    with tqdm(total=size, desc="uploading", unit="B", unit_scale=True) as bar:
        try:
            job = client.submit_job(
                model,
                file,
                params=orjson.loads(params) if params else None,
                completion_window_s=completion_window_s,
                webhook_url=webhook_url,
                on_bytes=bar.update,
                base_job_id=base,
            )
        except GristmillHTTPError as exc:
            typer.secho(str(exc), fg="red", err=True)
            raise typer.Exit(1) from exc
    typer.echo(f"job {job['job_id']}: {job['counts']['total']} items, {job['status']}")
    if base:
        typer.echo(f"reused from {base}: {job['usage']['reused_items']} items")
    if job.get("webhook_secret"):
        typer.echo(f"webhook secret (shown once): {job['webhook_secret']}")
    if wait:
        _show(_watch(client, job["job_id"], job["counts"]["total"]))


@app.command()
def status(job_id: str) -> None:
    """Status, counts and times of a job."""
    _show(_client().job(job_id))


@app.command("list")
def list_jobs(limit: int = 20) -> None:
    """Your most recent jobs."""
    for j in _client().jobs(limit):
        c = j["counts"]
        typer.echo(
            f"{j['job_id']}  {j['status']:<10} {c['total'] - c['queued']}/{c['total']}"
            f"  {j['model']}@{j['model_version']}  {j['created_at']}"
        )


@app.command()
def results(
    job_id: str,
    out: Path = typer.Option(..., "-o", "--out"),
    follow: bool = typer.Option(False, help="wait for unfinished items"),
) -> None:
    """Write per-item results, in input order, as JSONL."""
    client = _client()
    total = client.job(job_id)["counts"]["total"]
    n = 0
    with out.open("wb") as f, tqdm(total=total, desc="downloading", unit="item") as bar:
        for item in client.iter_results(job_id, follow=follow):
            f.write(orjson.dumps(item) + b"\n")
            n += 1
            bar.update(1)
    typer.echo(
        f"{n} results written to {out}"
        + ("" if n == total else f" ({total - n} not finished yet; use --follow)")
    )


@app.command()
def cancel(job_id: str) -> None:
    """Cancel the items that have not started; finished results stay."""
    _show(_client().cancel(job_id))
