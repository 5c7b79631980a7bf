"""`rollout` commands that talk to a running gateway through the public SDK
(`trainer_client.RolloutClient`): `submit`, `status`, `cancel`, `engines`, `weights`,
`keys`, `workers`, `export`. The gateway URL comes from `--url` or `$ROLLOUT_URL`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollout_service.cli._console import console
from rollout_service.config import gateway_url
from scheduler.roles import Role


def _url(args) -> str:
    return args.url or gateway_url()


def _client(args):
    from trainer_client import RolloutClient

    return RolloutClient(_url(args), api_key=args.api_key or os.environ.get("ROLLOUT_API_KEY"))


def _read_tasks(path: Path) -> tuple[list[dict], list[int]]:
    """The file's tasks, one JSON object a line, and the line each is on."""
    if not path.exists():
        raise SystemExit(f"no such file: {path}")
    tasks, lines = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON: {e}") from None
            lines.append(n)
    if not tasks:
        raise SystemExit(f"{path} has no tasks")
    return tasks, lines


def _invalid(e, path: Path, lines: list[int]) -> str:
    """A batch the SDK refused before sending it, one line a problem, a task's by its line in the file."""
    out = []
    for err in e.errors():
        loc, msg = list(err["loc"]), err["msg"].removeprefix("Value error, ")
        if loc[:1] == ["tasks"] and len(loc) > 1 and isinstance(loc[1], int) and loc[1] < len(lines):
            out.append(f"{path}:{lines[loc[1]]}: {msg}")
        else:
            out.append(f"{'.'.join(map(str, loc)) or 'batch'}: {msg}")
    return "invalid batch:\n  " + "\n  ".join(out)


def cmd_submit(args) -> None:
    import pydantic

    from trainer_client import APIError

    tasks, lines = _read_tasks(Path(args.file))
    env = args.env or Path(args.file).stem
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    if args.seed is not None:
        sampling["seed"] = args.seed
    with _client(args) as c:
        try:
            batch = c.submit(tasks, env=env, group_size=args.group_size, sampling=sampling, max_turns=args.max_turns,
                             idempotency_key=args.idempotency_key)
        except APIError as e:
            raise SystemExit(f"rejected: {e}" + (f"\n{json.dumps(e.details, indent=1)}" if e.details else "")) from None
        except pydantic.ValidationError as e:  # refused by the SDK, before anything was sent
            raise SystemExit(_invalid(e, Path(args.file), lines)) from None
        try:
            console.print(f"batch [bold]{batch.id}[/]: {batch.num_trajectories} trajectories of {env!r}"
                          + ("" if batch.created else " (existing batch for this idempotency key)"))
            if not args.wait:
                return
            t0 = time.monotonic()
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console) as bar:
                task = bar.add_task("rolling out", total=batch.num_trajectories, completed=c.status(batch.id).done)
                for _ev in c.events(batch.id):
                    bar.advance(task)
            _summary(c, batch.id, time.monotonic() - t0)
        except KeyboardInterrupt:  # Ctrl-C stops the waiting, not the batch: say so, and how to reach it
            print(f"\nstopped waiting; batch {batch.id} goes on: `rollout status {batch.id}` shows it, "
                  f"`rollout cancel {batch.id}` stops it", file=sys.stderr)
            raise SystemExit(130) from None


def _summary(c, bid: str, elapsed: float) -> None:
    """The batch's table, from its totals (kept by the gateway as trajectories finish: nothing
    read however large the batch); a batch from before totals were kept is read whole."""
    st = c.status(bid)
    tot = st.totals or _totals(c.trajectories(bid))
    table = Table(title=f"batch {bid} — {st.state.value}", show_header=False)
    for state, n in st.counts.items():
        if n:
            table.add_row(state.value, str(n))
    table.add_row("mean reward", f"{tot.mean_reward:.3f}" if tot.mean_reward is not None else "-")
    table.add_row("mean turns", f"{tot.turns / tot.turned:.2f}" if tot.turned else "-")
    table.add_row("tokens (sampled / total)", f"{tot.sampled_tokens} / {tot.sampled_tokens + tot.prompt_tokens}")
    table.add_row("failures", ", ".join(f"{k}: {n}" for k, n in sorted(tot.failures.items())) or "none")
    table.add_row("elapsed", f"{elapsed:.1f} s")
    console.print(table)


def _totals(trajs):
    """`BatchTotals` counted from the trajectories themselves."""
    from wire import BatchTotals

    turns = sampled = prompt = turned = 0
    rewards, kinds = [], {}
    for t in trajs:
        turned += bool(t.turns)
        turns += len(t.turns)
        sampled += sum(len(x.output_ids) for x in t.turns)
        prompt += sum(len(x.prompt_ids) for x in t.turns)
        if t.reward is not None:
            rewards.append(t.reward)
        if t.failure:
            kinds[t.failure.kind.value] = kinds.get(t.failure.kind.value, 0) + 1
    return BatchTotals(turns=turns, turned=turned, sampled_tokens=sampled, prompt_tokens=prompt, rewarded=len(rewards),
                       mean_reward=sum(rewards) / len(rewards) if rewards else None, failures=kinds)


def cmd_status(args) -> None:
    with _client(args) as c:
        if args.batch:
            _summary(c, args.batch, 0.0) if args.detail else _status_table([c.status(args.batch)])
            return
        _fleet_table(c)
        _status_table(c.batches(args.limit))


def _fleet_table(c) -> None:
    """The gateway's /metrics, as tables: the same numbers Prometheus scrapes."""
    from prometheus_client.parser import text_string_to_metric_families

    from trainer_client import APIError

    try:
        text = c.metrics()
    except APIError:  # a gateway without /metrics: the batch table alone
        return
    samples = [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]
    one = {n: v for n, labels, v in samples if not labels}
    by = lambda name, key: {lab[key]: v for n, lab, v in samples if n == name}  # noqa: E731
    t = Table(title="service", show_header=False)
    t.add_row("queue depth", f"{one.get('rollout_queue_depth', 0):.0f}")
    t.add_row("running", f"{one.get('rollout_trajectories_running', 0):.0f}")
    t.add_row("finished", ", ".join(f"{k}: {v:.0f}" for k, v in by("rollout_trajectories_finished_total", "state")
                                    .items()) or "-")
    t.add_row("failures", ", ".join(f"{k}: {v:.0f}" for k, v in by("rollout_failures_total", "kind").items())
              or "none")
    t.add_row("tokens", ", ".join(f"{k}: {v:.0f}" for k, v in by("rollout_tokens_total", "kind").items()) or "-")
    t.add_row("env workers", f"{one.get('rollout_env_workers', 0):.0f}")
    console.print(t)
    up = {lab["engine"]: (lab["role"], v) for n, lab, v in samples if n == "rollout_engine_up"}
    load = by("rollout_engine_inflight_tokens", "engine")
    if up:
        e = Table("engine", "role", "up", "in-flight tokens", title="engines")
        for eid, (role, ok) in sorted(up.items()):
            e.add_row(eid, role, "yes" if ok else "[red]no[/]", f"{load.get(eid, 0):.0f}")
        console.print(e)
    roles = [Role(role) for role, _ in up.values()]
    missing = [half for half, some in (("prefills", any(r.prefills for r in roles)),
                                       ("decodes", any(r.decodes for r in roles))) if not some]
    if missing and one.get("rollout_queue_depth", 0):  # what rollout workers wait for before they claim
        console.print(f"[yellow]no engine {'registered' if not up else 'takes ' + ' or '.join(missing)}: "
                      "queued trajectories wait for one (`rollout engines add`)[/]")


def _status_table(rows) -> None:
    table = Table("batch", "env", "state", "done", "total", "queued", "running", "failed")
    for st in rows:
        c = {k.value: v for k, v in st.counts.items()}
        table.add_row(st.id, st.env, st.state.value, str(st.done), str(st.num_trajectories), str(c["queued"]),
                      str(c["running"]), str(c["failed"]))
    console.print(table)


def cmd_cancel(args) -> None:
    with _client(args) as c:
        st = c.cancel(args.batch)
        console.print(f"batch {st.id}: {st.state.value}")


def cmd_engines(args) -> None:
    with _client(args) as c:
        if args.action == "add":
            c.register_engine(args.id, args.engine_url, model=args.model, tokenizer=args.tokenizer, kind=args.kind,
                              gpus=args.gpus)
        elif args.action == "rm":
            c.deregister_engine(args.id)
        elif args.action == "role":
            if args.engine_url not in ("prefill", "decode", "mixed"):
                raise SystemExit("usage: rollout engines role ID prefill|decode|mixed")
            c.set_engine_role(args.id, args.engine_url)
        table = Table("id", "kind", "url", "model", "GPUs", "role", "state", "up", "can serve", "KV connector",
                      "policy version", "tokenizer")
        for e in c.engines():
            state = f"{e['state']} -> {e['next_role']}" if e.get("next_role") else e["state"]
            # what the engine's KV connector allows, as workers detected it ("?": not asked yet)
            can = ", ".join(e["can_serve"]) if e.get("can_serve") else "?"
            up = "yes" if e.get("up", True) else "[red]no[/]"  # (a gateway before `up`: as the metric reads)
            table.add_row(e["id"], e["kind"], e["url"], e["model"], str(e.get("gpus", 1)), e["role"], state, up, can,
                          e.get("kv") or "not detected yet", str(e["policy_version"]), e["tokenizer"])
        console.print(table)


def cmd_weights(args) -> None:
    if bool(args.path) == bool(args.lora):
        raise SystemExit("give a checkpoint PATH or --lora NAME PATH (exactly one)")
    with _client(args) as c:
        res = c.update_weights(path=args.path, lora=tuple(args.lora) if args.lora else None, version=args.version)
        for r in res.results:
            console.print(f"{r.engine_id}: {'ok' if r.ok else 'FAILED ' + (r.error or '')} ({r.seconds:.1f} s)")
        console.print(f"policy version {res.version}")


def cmd_keys(args) -> None:
    with _client(args) as c:
        got = c.create_api_key(args.tenant, admin=args.admin)
        console.print(f"key for tenant {got.tenant}{' (admin)' if got.admin else ''}, shown once:")
        print(got.key)


def cmd_workers(args) -> None:
    with _client(args) as c:
        table = Table("id", "url", "envs")
        for w in c.workers():
            table.add_row(w.id, w.url, ", ".join(w.envs))
        console.print(table)


def cmd_export(args) -> None:
    from rollout_service.recording import write

    with _client(args) as c:
        bid = args.batch
        if bid == "latest":
            newest = c.batches(1)
            if not newest:
                raise SystemExit("error: no batches yet")
            bid = newest[0].id
        out = Path(args.output or f"{bid}.jsonl")
        status, request = c.status(bid), c.request(bid)  # an unknown batch: 404, before any file
        tmp = out.with_name(out.name + ".part")
        with tmp.open("w") as f:
            n = write(f, status, request, c.trajectories(bid))
        tmp.replace(out)  # a failed export leaves no half-written recording under the name asked for
    note = "" if status.state.terminal else f" (batch still {status.state.value}: unfinished trajectories as they are)"
    console.print(f"wrote {out}: batch {bid}, {n} trajectories{note}")
