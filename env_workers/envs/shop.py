"""`shop`: find and buy a product that matches an instruction (in the spirit of WebShop).

A fixed seed generates a catalog of a few hundred products (category, brand, attributes,
options such as color and size, price); a task seed picks one product and writes an
instruction from some of its attributes, one value of each option and a price limit. The
model browses with WebShop's two actions:

    search[<query>]      (on the search page)  -> 10 results per page, ranked by BM25
    click[<button>]      a product id, an option value, `buy now`, `next >`, `< prev`, `back to search`

Reward is dense, WebShop's formula, given when the model clicks `buy now`:

    reward = r_type * (matched attributes + matched options + [price within the limit])
                    / (asked attributes   + asked options   + 1)

where r_type is 1 if the product is of the asked category, else 0. Out of steps: truncated, 0.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Any

from env_workers.env import EnvError, StepResult
from env_workers.envs.bm25 import BM25
from env_workers.registry import EnvSpec, register
from wire import Message

_CATEGORIES = {  # category -> (attributes, options)
    "t-shirt": (["cotton", "slim fit", "organic", "v-neck", "quick dry"],
                {"color": ["black", "white", "navy", "red"], "size": ["small", "medium", "large", "x-large"]}),
    "sneakers": (["running", "waterproof", "leather", "lightweight", "memory foam"],
                 {"color": ["white", "grey", "black", "blue"], "size": ["size 7", "size 8", "size 9", "size 10"]}),
    "mug": (["ceramic", "insulated", "dishwasher safe", "stainless steel"],
            {"color": ["white", "green", "black"], "capacity": ["12 oz", "16 oz", "20 oz"]}),
    "backpack": (["waterproof", "laptop sleeve", "lightweight", "anti theft", "usb charging"],
                 {"color": ["black", "grey", "olive"], "capacity": ["20 l", "30 l", "40 l"]}),
    "headphones": (["wireless", "noise cancelling", "over ear", "foldable", "long battery"],
                   {"color": ["black", "silver", "rose"]}),
    "desk lamp": (["led", "dimmable", "usb charging", "clamp", "eye care"],
                  {"color": ["white", "black"], "power": ["battery", "plug in"]}),
}
_BRANDS = ["acme", "nordic", "zenith", "brightline", "koda", "veloce", "urbanix", "solace"]
SYSTEM = (
    "You are shopping on a website. Act with exactly one action per turn:\n"
    "search[<query>]  on the search page, e.g. search[waterproof backpack]\n"
    "click[<button>]  where <button> is a product id, an option value, buy now, next >, < prev or back to search, "
    "e.g. click[B00042] or click[black] or click[buy now]\n"
    "Select every option the instruction asks for before you click buy now."
)
_ACTION = re.compile(r"(search|click)\[(.+?)\]", re.I)


@dataclass(slots=True, frozen=True)
class Product:
    id: str
    category: str
    title: str
    attributes: frozenset[str]
    options: dict[str, list[str]]
    price: float


@functools.lru_cache(maxsize=1)
def catalog(seed: int = 0, n: int = 300) -> tuple[dict[str, Product], BM25]:
    rng = random.Random(seed)
    products = {}
    for i in range(n):
        cat = rng.choice(sorted(_CATEGORIES))
        attrs, opts = _CATEGORIES[cat]
        mine = frozenset(rng.sample(attrs, rng.randint(1, 3)))
        options = {k: sorted(rng.sample(v, rng.randint(2, len(v)))) for k, v in opts.items()}
        pid = f"B{i:05d}"
        title = f"{rng.choice(_BRANDS).title()} {' '.join(sorted(mine))} {cat}"
        products[pid] = Product(pid, cat, title, mine, options, round(rng.uniform(8, 120), 2))
    index = BM25({p.id: f"{p.title} {p.category} {' '.join(p.attributes)}" for p in products.values()})
    return products, index


def instruction(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    products, _ = catalog()
    target = products[rng.choice(sorted(products))]
    attrs = sorted(rng.sample(sorted(target.attributes), min(len(target.attributes), rng.randint(1, 2))))
    opts = {k: rng.choice(v) for k, v in sorted(target.options.items())}
    limit = float(int(target.price * rng.uniform(1.05, 1.5)) + 1)
    text = (f"Find me a {target.category} that is {' and '.join(attrs)}, with "
            f"{', '.join(f'{k} {v}' for k, v in opts.items())}, and price lower than {limit:.2f} dollars.")
    return {"category": target.category, "attributes": attrs, "options": opts, "price": limit, "text": text}


def score(goal: dict[str, Any], p: Product, chosen: dict[str, str]) -> float:
    if p.category != goal["category"]:
        return 0.0
    hits = sum(a in p.attributes for a in goal["attributes"])
    hits += sum(chosen.get(k) == v for k, v in goal["options"].items())
    hits += p.price <= goal["price"]
    return hits / (len(goal["attributes"]) + len(goal["options"]) + 1)


class ShopEnv:
    def __init__(self, max_steps: int = 15, per_page: int = 10) -> None:
        self.max_steps, self.per_page = max_steps, per_page
        self._goal: dict[str, Any] = {}
        self._page, self._results, self._offset = "search", [], 0
        self._item: Product | None = None
        self._chosen: dict[str, str] = {}
        self._steps, self._done = 0, True

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        if "seed" not in task:
            raise EnvError("a shop task needs 'seed'")
        self._goal = instruction(int(task["seed"]))
        self._page, self._results, self._offset, self._item, self._chosen = "search", [], 0, None, {}
        self._steps, self._done = 0, False
        return [Message(role="system", content=SYSTEM),
                Message(role="user", content=f"Instruction: {self._goal['text']}\n\n[search]")], {}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        self._steps += 1
        m = _ACTION.search(action)
        verb, arg = (m.group(1).lower(), m.group(2).strip().lower()) if m else ("", "")
        if verb == "click" and arg == "buy now" and self._page == "item":
            self._done = True
            r = score(self._goal, self._item, self._chosen)
            return StepResult([], r, True, False, {"bought": self._item.id, "options": dict(self._chosen),
                                                   "steps": self._steps})
        text = self._act(verb, arg) if m else "Invalid action. Use search[<query>] or click[<button>]."
        self._done = self._steps >= self.max_steps
        return StepResult([Message(role="user", content=f"Instruction: {self._goal['text']}\n\n{text}")], 0.0,
                          False, self._done, {"steps": self._steps, "page": self._page})

    def _act(self, verb: str, arg: str) -> str:
        products, index = catalog()
        if verb == "search":
            if self._page != "search":
                return "There is no search box on this page; click[back to search] first.\n\n" + self._render()
            self._results, self._offset, self._page = [d for d, _ in index.search(arg, k=50)], 0, "results"
        elif arg == "back to search":
            self._page, self._item, self._chosen = "search", None, {}
        elif arg == "next >" and self._page == "results" and self._offset + self.per_page < len(self._results):
            self._offset += self.per_page
        elif arg == "< prev" and self._page == "item":
            self._page, self._item, self._chosen = "results", None, {}
        elif arg == "< prev" and self._page == "results" and self._offset > 0:
            self._offset -= self.per_page
        elif self._page == "results" and arg.upper() in self._results[self._offset:self._offset + self.per_page]:
            self._page, self._item, self._chosen = "item", products[arg.upper()], {}
        elif self._page == "item" and (kind := next((k for k, v in self._item.options.items() if arg in v), None)):
            self._chosen[kind] = arg
        else:
            return f"There is no button '{arg}' on this page.\n\n" + self._render()
        return self._render()

    def _render(self) -> str:
        if self._page == "search":
            return "[search]"
        if self._page == "results":
            products, _ = catalog()
            shown = self._results[self._offset:self._offset + self.per_page]
            if not shown:
                return "No results.\n[back to search]"
            lines = [f"[{d}] {products[d].title} ${products[d].price:.2f}" for d in shown]
            nav = ["[back to search]"] + (["[< prev]"] if self._offset else []) + \
                (["[next >]"] if self._offset + self.per_page < len(self._results) else [])
            return f"Results {self._offset + 1}-{self._offset + len(shown)} of {len(self._results)}:\n" + \
                "\n".join(lines) + "\n" + " ".join(nav)
        p = self._item
        opts = "\n".join(f"{k}: " + " ".join(f"[{v}]" + ("*" if self._chosen.get(k) == v else "") for v in vs)
                         for k, vs in p.options.items())
        return f"{p.title}\nPrice: ${p.price:.2f}\nFeatures: {', '.join(sorted(p.attributes))}\n{opts}\n" \
               f"[buy now] [< prev] [back to search]"

    def close(self) -> None:
        self._done = True


register(EnvSpec("shop", ShopEnv, "search and click through a generated catalog to buy a matching product; dense reward",
                 example_tasks=[{"seed": 0}, {"seed": 5}]))
