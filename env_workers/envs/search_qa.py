"""`search_qa`: answer a question by searching a local corpus (in the spirit of DeepSearchQA).

The corpus is generated once from a fixed seed: fictional people, cities and companies, one
document each, linked to one another (a company's founder is a person, a person's
birthplace is a city). Questions are one hop ("Who founded Vexmoor Labs?") or two
("Which river flows through the city where the founder of Vexmoor Labs was born?"), so
the model has to search, open documents and follow links. One action per turn:

    search: <query>     the 5 best documents by BM25: id, title and first sentence
    open: <doc id>      the whole document
    answer: <text>      ends the episode; reward 1.0 on a normalized exact match, else 0

Normalization lowercases and drops punctuation, articles and extra spaces. Out of steps:
truncated with reward 0.
"""

from __future__ import annotations

import functools
import random
import re
import string
from typing import Any

from env_workers.env import EnvError, StepResult
from env_workers.envs.bm25 import BM25
from env_workers.registry import EnvSpec, register
from wire import Message

SYSTEM = (
    "Answer the question using the document collection. Write exactly one action per turn:\n"
    "search: <query>   lists matching documents (id, title, first sentence)\n"
    "open: <doc id>    shows a whole document, e.g. open: doc-017\n"
    "answer: <text>    your final answer, as short as possible (a name, a year, a place)"
)
_SYL = ["ka", "ren", "vo", "mi", "tal", "dor", "sen", "lu", "bra", "quin", "zel", "mor", "fa", "ti", "gan", "el", "rho",
        "va", "nis", "oth"]
_PROFESSIONS = ["chemist", "architect", "poet", "engineer", "cartographer", "composer", "botanist", "economist"]
_PRODUCTS = ["water filters", "bicycles", "telescopes", "board games", "solar panels", "violins", "maps", "tea"]
_ACTION = re.compile(r"^\s*(search|open|answer)\s*:\s*(.+?)\s*$", re.I | re.M)


def _name(rng: random.Random, used: set[str], parts: int) -> str:
    while True:
        n = "".join(rng.choice(_SYL) for _ in range(parts)).capitalize()
        if n not in used:
            used.add(n)
            return n


@functools.lru_cache(maxsize=1)
def corpus(seed: int = 0) -> tuple[dict[str, dict[str, Any]], BM25]:
    """{doc id: {"title", "text", "kind", facts...}} and its index."""
    rng, used = random.Random(seed), set()
    countries = [_name(rng, used, 3) + "ia" for _ in range(8)]
    cities = [{"kind": "city", "title": _name(rng, used, 2) + "burg", "country": rng.choice(countries),
               "river": "the " + _name(rng, used, 2) + " River", "founded": rng.randint(900, 1700)} for _ in range(25)]
    people = [{"kind": "person", "title": f"{_name(rng, used, 2)} {_name(rng, used, 3)}",
               "born": rng.randint(1850, 1990), "birthplace": rng.choice(cities)["title"],
               "profession": rng.choice(_PROFESSIONS)} for _ in range(40)]
    companies = [{"kind": "company", "title": f"{_name(rng, used, 2)} {rng.choice(['Labs', 'Works', 'Group', 'Co'])}",
                  "founder": rng.choice(people)["title"], "founded": rng.randint(1900, 2015),
                  "hq": rng.choice(cities)["title"], "product": rng.choice(_PRODUCTS)} for _ in range(25)]
    docs: dict[str, dict[str, Any]] = {}
    for e in cities + people + companies:
        if e["kind"] == "city":
            e["text"] = (f"{e['title']} is a city in {e['country']}. {e['river'].capitalize()} flows through "
                         f"{e['title']}. It was founded in {e['founded']}.")
        elif e["kind"] == "person":
            e["text"] = (f"{e['title']} was a {e['profession']} born in {e['born']} in {e['birthplace']}. "
                         f"{e['title'].split()[0]} is remembered for work as a {e['profession']}.")
        else:
            e["text"] = (f"{e['title']} is a company that makes {e['product']}. It was founded in {e['founded']} by "
                         f"{e['founder']} and is headquartered in {e['hq']}.")
        docs[f"doc-{len(docs):03d}"] = e
    rng.shuffle(order := sorted(docs))  # ids say nothing about the kind of document
    docs = {f"doc-{i:03d}": docs[k] for i, k in enumerate(order)}
    return docs, BM25({d: f"{e['title']} {e['text']}" for d, e in docs.items()})


def question(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    docs, _ = corpus()
    by = {e["title"]: e for e in docs.values()}
    kind = rng.choice(["born", "river", "founder", "hq", "founder_country", "birthplace_river"])
    pick = lambda k: rng.choice(sorted((e for e in docs.values() if e["kind"] == k), key=lambda e: e["title"]))  # noqa: E731
    if kind == "born":
        p = pick("person")
        return {"question": f"In what year was {p['title']} born?", "answer": str(p["born"]), "hops": 1}
    if kind == "river":
        c = pick("city")
        return {"question": f"Which river flows through {c['title']}?", "answer": c["river"], "hops": 1}
    c = pick("company")
    if kind == "founder":
        return {"question": f"Who founded {c['title']}?", "answer": c["founder"], "hops": 1}
    if kind == "hq":
        return {"question": f"In which city is {c['title']} headquartered?", "answer": c["hq"], "hops": 1}
    city = by[by[c["founder"]]["birthplace"]]
    if kind == "founder_country":
        return {"question": f"In which country was the founder of {c['title']} born?", "answer": city["country"],
                "hops": 2}
    return {"question": f"Which river flows through the city where the founder of {c['title']} was born?",
            "answer": city["river"], "hops": 2}


def normalize(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


class SearchQAEnv:
    def __init__(self, max_steps: int = 12, k: int = 5) -> None:
        self.max_steps, self.k = max_steps, k
        self._q: dict[str, Any] = {}
        self._steps, self._done = 0, True

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        if "seed" in task:
            self._q = question(int(task["seed"]))
        elif "question" in task and "answer" in task:
            self._q = {"question": str(task["question"]), "answer": str(task["answer"])}
        else:
            raise EnvError("a search_qa task needs 'seed', or 'question' and 'answer'")
        self._steps, self._done = 0, False
        return [Message(role="system", content=SYSTEM), Message(role="user", content=self._q["question"])], {}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        self._steps += 1
        m = _ACTION.search(action)
        verb, arg = (m.group(1).lower(), m.group(2)) if m else ("", "")
        if verb == "answer":
            self._done = True
            ok = normalize(arg) == normalize(self._q["answer"])
            return StepResult([], float(ok), True, False, {"answer": arg, "expected": self._q["answer"],
                                                           "steps": self._steps})
        docs, index = corpus()
        if verb == "search":
            hits = index.search(arg, self.k)
            text = "\n".join(f"[{d}] {docs[d]['title']}: {docs[d]['text'].split('. ')[0]}." for d, _ in hits) \
                or "No documents match."
        elif verb == "open":
            d = docs.get(arg.strip("[]<> ").lower())
            text = f"[{arg}] {d['title']}\n{d['text']}" if d else f"No document {arg!r}. Ids look like doc-017."
        else:
            text = "Write one action: 'search: <query>', 'open: <doc id>' or 'answer: <text>'."
        self._done = self._steps >= self.max_steps
        return StepResult([Message(role="user", content=text)], 0.0, False, self._done, {"steps": self._steps})

    def close(self) -> None:
        self._done = True


register(EnvSpec("search_qa", SearchQAEnv, "multi-hop questions over a generated corpus with search/open tools",
                 example_tasks=[{"seed": 0}, {"seed": 4}, {"question": "Who?", "answer": "nobody"}]))
