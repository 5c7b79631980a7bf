"""Post-hoc summary of recorded runs: one line per figure, and JSON.

    python -m benchmarks.rlbench summary STATE [STATE ...] [--json PATH]

Per run: task and level, baseline, best (and its improvement), submissions by status, the
score over time, the time to the first improvement over the baseline ("never" if none), and
the failure kinds of the test trajectories, summed over submissions.

    >>> fmt_t(0), fmt_t(754.2), fmt_t(3725)
    ('0:00', '12:34', '1:02:05')
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.rlbench.records import Records, RunRecord, Status, SubmissionRecord


@dataclass(slots=True)
class RunSummary:
    run: str
    task: str
    level: str
    engine: str
    budget_s: float
    baseline: float
    best: float
    improvement: float  # best - baseline
    submissions: int
    by_status: dict[str, int]
    rejected: dict[str, int]  # error code -> count
    series: list[dict[str, float]]  # [{"t_s", "score"}], the baseline first at t_s = 0
    first_improvement_s: float | None  # None: never
    failures: dict[str, int] = field(default_factory=dict)


def summarize(records: list[RunRecord | SubmissionRecord], margin: float = 0.0) -> list[RunSummary]:
    """`margin`: the first improvement is the first score above baseline + margin (greedy
    evaluation on a CPU engine is not bit-exact: a copy of the base model can gain a task)."""
    runs = [r for r in records if isinstance(r, RunRecord)]
    out = []
    for run in runs:
        subs = sorted((s for s in records if isinstance(s, SubmissionRecord) and s.run == run.run), key=lambda s: s.n)
        scored = [s for s in subs if s.status is Status.scored]
        best = max([run.baseline, *(s.score for s in scored)])
        first = next((s.t_s for s in scored if s.score > run.baseline + margin), None)
        failures: Counter[str] = Counter()
        for s in subs:
            failures.update(s.failures)
        out.append(RunSummary(
            run.run, run.task, run.level, run.engine, run.budget_s, run.baseline, best, best - run.baseline, len(subs),
            dict(Counter(s.status.value for s in subs)),
            dict(Counter((s.error or "").split(":", 1)[0] for s in subs if s.status is Status.rejected)),
            [{"t_s": 0.0, "score": run.baseline}] + [{"t_s": s.t_s, "score": s.score} for s in scored],
            first, dict(failures)))
    return out


def fmt_t(seconds: float) -> str:
    s = round(seconds)
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _counts(d: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(d.items())) or "none"


def lines(s: RunSummary) -> list[str]:
    st = s.by_status
    series = " | ".join(f"{fmt_t(p['t_s'])} {p['score']:.4f}" + (" base" if i == 0 else "")
                        for i, p in enumerate(s.series))
    rejected = f": {_counts(s.rejected)}" if s.rejected else ""
    return [
        f"run {s.run}   task {s.task} ({s.level})   engine {s.engine}   budget {s.budget_s / 60:g} min",
        f"  baseline                  {s.baseline:.4f}",
        f"  best                      {s.best:.4f}   ({s.improvement:+.4f} over baseline)",
        (f"  submissions               {s.submissions}   (scored {st.get('scored', 0)}, "
         f"failed {st.get('failed', 0)}, rejected {st.get('rejected', 0)}{rejected})"),
        f"  score over time           {series}",
        "  time to first improvement " + ("never" if s.first_improvement_s is None else fmt_t(s.first_improvement_s)),
        f"  failure kinds             {_counts(s.failures)}",
    ]


def main(state_dirs: list[str], json_path: str | None = None, margin: float = 0.0) -> list[RunSummary]:
    summaries: list[RunSummary] = []
    for d in state_dirs:
        path = Path(d) / "records.jsonl"
        if not path.is_file():
            raise SystemExit(f"{d}: no records.jsonl (is it a grader state folder whose grader has started?)")
        summaries += summarize(Records(path).read(), margin)
    for s in summaries:
        print("\n".join(lines(s)))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps([asdict(s) for s in summaries], indent=2) + "\n")
        print(f"wrote {json_path}")
    return summaries
