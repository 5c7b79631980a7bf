"""`textworld`: a procedurally generated household text game (in the spirit of ALFWorld).

A seed builds a house (3-4 rooms joined as a tree), fills rooms with receptacles (some of
them closed: open them to see inside) and objects, and sets a goal: put an object in or on
a receptacle, possibly after cleaning it in the kitchen sink. The model plays with one
command per turn:

    look | inventory | go <room> | open <receptacle> | close <receptacle> | examine <receptacle>
    take <object> | put <object> in <receptacle> | clean <object> with sink

It can carry one object. Reward is sparse: 1.0 the turn the goal holds (the episode ends),
else 0; after `max_steps` commands the episode is truncated.

A task is `{"seed": N}` and optionally `"level"`, a curriculum for small models:
- 1: one room; the object lies on an open receptacle, the target is open, no cleaning; the
  intro lists what lies where. Two commands win (`take`, `put`).
- 2: one room with closed receptacles (and the sink, in the kitchen); the intro lists what
  lies on the open ones. Up to five commands.
- 3 (the default): the whole house.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from env_workers.env import EnvError, StepResult
from env_workers.registry import EnvSpec, register
from wire import Message

# room -> receptacles (name, starts closed)
_ROOMS = {
    "kitchen": [("fridge", True), ("cabinet", True), ("countertop", False), ("sink", False), ("microwave", True)],
    "living room": [("sofa", False), ("coffee table", False), ("shelf", False)],
    "bedroom": [("bed", False), ("drawer", True), ("desk", False)],
    "bathroom": [("bathtub", False), ("towel rack", False), ("medicine cabinet", True)],
    "office": [("bookcase", False), ("filing cabinet", True), ("armchair", False)],
    "garage": [("workbench", False), ("toolbox", True)],
}
_OBJECTS = ["mug", "apple", "book", "key", "remote", "towel", "plate", "pen", "soap", "bowl", "candle", "spoon"]
_CLEANABLE = {"mug", "apple", "plate", "bowl", "spoon"}
SYSTEM = (
    "You are in a house. Reach the goal by typing one command per turn, exactly one of:\n"
    "look | inventory | go <room> | open <receptacle> | close <receptacle> | examine <receptacle> | "
    "take <object> | put <object> in <receptacle> | clean <object> with sink\n"
    "You can carry one object. Closed receptacles must be opened before you can see or use what is inside. "
    "Reply with the command only, e.g. 'go kitchen' or 'put mug in cabinet'."
)
# A worked game, played as chat turns before the real one: a 135M model that saw it as text in
# the first observation narrated outcomes ("You put a towel in the bed.") instead of typing
# commands; as its own earlier turns, it types commands.
EXAMPLE: list[tuple[str, str]] = [
    ("user", "You are in the bedroom. You see: bed, desk. On/in the bed you see: book. The desk is empty.\n"
             "Your task is to: put a book in the desk."),
    ("assistant", "take book"),
    ("user", "You take the book from the bed."),
    ("assistant", "put book in desk"),
    ("user", "You put the book in the desk. You have completed the task!"),
]
NEW_GAME = "\n\nA new game.\n"


@dataclass(slots=True)
class World:
    rooms: dict[str, list[str]]                  # room -> receptacles
    exits: dict[str, list[str]]                  # room -> adjacent rooms
    where: dict[str, str]                        # receptacle -> room
    closed: set[str]
    contents: dict[str, list[str]]               # receptacle -> objects
    here: str
    holding: str | None = None
    clean: set[str] = field(default_factory=set)
    goal: tuple[str, str, bool] = ("", "", False)  # object, receptacle, must be clean

    def goal_text(self) -> str:
        obj, rec, clean = self.goal
        return f"Your task is to: put a {'clean ' if clean else ''}{obj} in the {rec}."

    def done(self) -> bool:
        obj, rec, clean = self.goal
        return obj in self.contents[rec] and (not clean or obj in self.clean)


LEVELS = (1, 2, 3)


def generate(seed: int, level: int = 3) -> World:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, not {level!r}")
    if level < 3:
        return _one_room(seed, level)
    rng = random.Random(seed)
    names = ["kitchen"] + rng.sample(sorted(set(_ROOMS) - {"kitchen"}), rng.randint(2, 3))
    rng.shuffle(names)
    exits: dict[str, list[str]] = {r: [] for r in names}
    for i, r in enumerate(names[1:], 1):
        other = names[rng.randrange(i)]
        exits[r].append(other)
        exits[other].append(r)
    rooms = {r: [n for n, _ in _ROOMS[r]] for r in names}
    where = {rec: r for r, recs in rooms.items() for rec in recs}
    closed = {n for r in names for n, c in _ROOMS[r] if c}
    contents: dict[str, list[str]] = {rec: [] for rec in where}
    placeable = sorted(rec for rec in where if rec != "sink")
    for obj in rng.sample(_OBJECTS, 6):
        contents[rng.choice(placeable)].append(obj)
    w = World(rooms, {r: sorted(e) for r, e in exits.items()}, where, closed, contents, here=rng.choice(names))
    objs = sorted(o for rec in placeable for o in contents[rec])
    obj = rng.choice(objs)
    start = next(rec for rec in placeable if obj in contents[rec])
    target = rng.choice([rec for rec in placeable if rec != start])
    w.goal = (obj, target, obj in _CLEANABLE and rng.random() < 0.5)
    return w


def _one_room(seed: int, level: int) -> World:
    """Levels 1 and 2: the start room is the whole world."""
    rng = random.Random(seed)
    opened = [r for r, recs in _ROOMS.items() if sum(not c and n != "sink" for n, c in recs) >= 2]
    room = rng.choice(sorted(opened if level == 1 else set(_ROOMS) - {"living room"}))
    recs = [n for n, c in _ROOMS[room] if n != "sink" and (level == 2 or not c)]
    closed = {n for n, c in _ROOMS[room] if c}
    contents: dict[str, list[str]] = {n: [] for n, _ in _ROOMS[room]}
    for obj in rng.sample(_OBJECTS, 3):
        contents[rng.choice(recs)].append(obj)
    w = World({room: [n for n, _ in _ROOMS[room]]}, {room: []}, {n: room for n in contents}, closed, contents,
              here=room)
    obj = rng.choice(sorted(o for n in recs for o in contents[n]))
    target = rng.choice([n for n in recs if obj not in contents[n]])
    w.goal = (obj, target, level == 2 and room == "kitchen" and obj in _CLEANABLE and rng.random() < 0.5)
    return w


def survey(w: World) -> str:
    """What lies on each receptacle of this room, or that it is closed (the intro of levels 1 and 2)."""
    return " ".join(_visible(w, rec) for rec in w.rooms[w.here] if rec != "sink")


def _visible(w: World, rec: str) -> str:
    if rec in w.closed:
        return f"The {rec} is closed."
    items = w.contents[rec]
    return f"On/in the {rec} you see: {', '.join(items)}." if items else f"The {rec} is empty."


def describe(w: World) -> str:
    recs = ", ".join(w.rooms[w.here])
    exits = f" Exits: {', '.join(w.exits[w.here])}." if w.exits[w.here] else ""
    return f"You are in the {w.here}. You see: {recs}.{exits}"


class TextWorldEnv:
    def __init__(self, max_steps: int = 40) -> None:
        self.max_steps = max_steps
        self._w: World | None = None
        self._steps, self._done = 0, True

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        if "seed" not in task:
            raise EnvError("a textworld task needs 'seed'")
        level = task.get("level", 3)
        if level not in LEVELS:
            raise EnvError(f"textworld 'level' must be one of {LEVELS}, not {level!r}")
        self._w = generate(int(task["seed"]), level)
        self._steps, self._done = 0, False
        intro = describe(self._w) + (f" {survey(self._w)}" if level < 3 else "")
        example = [Message(role=r, content=c) for r, c in EXAMPLE]
        example[-1] = Message(role="user", content=f"{example[-1].content}{NEW_GAME}{intro}\n{self._w.goal_text()}")
        return [Message(role="system", content=SYSTEM), *example], {"goal": list(self._w.goal)}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        self._steps += 1
        text = self.command(action.strip().splitlines()[0] if action.strip() else "")
        w = self._w
        if w.done():
            self._done = True
            return StepResult([Message(role="user", content=text + " You have completed the task!")], 1.0, True, False,
                              {"steps": self._steps, "won": True})
        self._done = self._steps >= self.max_steps
        return StepResult([Message(role="user", content=text)], 0.0, False, self._done, {"steps": self._steps})

    def command(self, cmd: str) -> str:
        w = self._w
        c = re.sub(r"\s+", " ", cmd.lower().strip(" .!'\"`"))
        # A transcript's prompt mark, copied; or the move narrated ("you take the mug").
        c = re.sub(r"^(?:>|you\s*:|command\s*:|you |i )\s*", "", c)
        in_room = w.rooms[w.here]
        if c in ("look", "l"):
            return describe(w)
        if c in ("inventory", "i"):
            return f"You are carrying: {w.holding}." if w.holding else "You are carrying nothing."
        if m := re.fullmatch(r"go (?:to )?(?:the |an? )?(.+)", c):
            room = m.group(1)
            if room not in w.exits[w.here]:
                return f"You can't go to '{room}' from here. Exits: {', '.join(w.exits[w.here])}."
            w.here = room
            return describe(w)
        if m := re.fullmatch(r"(open|close|examine) (?:the |an? )?(.+)", c):
            verb, rec = m.groups()
            if rec not in in_room:
                return f"There is no {rec} here."
            if verb == "examine":
                return _visible(w, rec)
            if not any(n == rec and can for n, can in _ROOMS[w.here]):
                return f"The {rec} cannot be {verb}d."
            (w.closed.add if verb == "close" else w.closed.discard)(rec)
            return f"You {verb} the {rec}. " + (_visible(w, rec) if verb == "open" else "")
        if m := re.fullmatch(r"(?:take|get|pick up) (?:the |an? )?(.+?)(?: (?:from|in|on|off) (?:the |an? )?.+)?", c):
            obj = m.group(1)
            if w.holding:
                return f"You are already carrying the {w.holding}."
            src = next((r for r in in_room if r not in w.closed and obj in w.contents[r]), None)
            if src is None:
                return f"You don't see a {obj} you can reach here."
            w.contents[src].remove(obj)
            w.holding = obj
            return f"You take the {obj} from the {src}."
        if m := re.fullmatch(r"put (?:the |an? )?(.+?) (?:in|on|into|onto) (?:the |an? )?(.+)", c):
            obj, rec = m.groups()
            if w.holding != obj:
                return f"You are not carrying a {obj}."
            if rec not in in_room:
                return f"There is no {rec} here."
            if rec in w.closed:
                return f"The {rec} is closed."
            w.contents[rec].append(obj)
            w.holding = None
            return f"You put the {obj} in the {rec}."
        if m := re.fullmatch(r"clean (?:the |an? )?(.+?) (?:with|in) (?:the |an? )?sink", c):
            obj = m.group(1)
            if w.holding != obj:
                return f"You are not carrying a {obj}."
            if "sink" not in in_room:
                return "There is no sink here."
            w.clean.add(obj)
            return f"You clean the {obj} in the sink."
        return "Unknown command. Commands: " + SYSTEM.split("\n")[1]

    def close(self) -> None:
        self._done = True


register(EnvSpec("textworld", TextWorldEnv, "household text game: rooms, receptacles, objects; sparse success reward",
                 example_tasks=[{"seed": 0}, {"seed": 11}, {"seed": 5, "level": 1}]))
