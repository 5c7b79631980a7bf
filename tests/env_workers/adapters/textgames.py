"""Two small Gymnasium text envs, registered on import the way a third-party package does it
(`gymnasium.register` at import time), for `gymnasium:tests.env_workers.adapters.textgames:ID`."""

from __future__ import annotations

import gymnasium
from gymnasium import spaces

WORDS = ["apple", "river", "stone", "cloud"]


class GuessWord(gymnasium.Env):
    """Guess the hidden word; each wrong guess tells how many letters are in the right place."""

    metadata = {"render_modes": [], "system_prompt": "Guess the hidden five-letter word. Reply with the word only."}

    def __init__(self, max_guesses: int = 4) -> None:
        self.observation_space = spaces.Text(200, charset=" abcdefghijklmnopqrstuvwxyz0123456789:,.")
        self.action_space = spaces.Text(5, min_length=5, charset="abcdefghijklmnopqrstuvwxyz")
        self.max_guesses = max_guesses

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        self.guesses = 0
        return "the word is one of: " + ", ".join(WORDS), {"guesses": 0}

    def step(self, action: str):
        self.guesses += 1
        if action == self.word:
            return "correct", 1.0, True, False, {"guesses": self.guesses}
        if action == "crash":
            raise RuntimeError("the guessing machine broke")
        hits = sum(a == b for a, b in zip(action, self.word))
        return f"{hits} letters in place", 0.0, False, self.guesses >= self.max_guesses, {"guesses": self.guesses}


class Corridor(gymnasium.Env):
    """Walk right (1) or left (0) along a corridor to its end."""

    def __init__(self, length: int = 3) -> None:
        self.observation_space = spaces.Discrete(length + 1)
        self.action_space = spaces.Discrete(2)
        self.length = length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self.pos, {}

    def step(self, action: int):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos == self.length
        return self.pos, float(done), done, False, {}


class Pendulumish(gymnasium.Env):
    """A continuous observation: no text form."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (3,))
        self.action_space = spaces.Discrete(2)


gymnasium.register("textgames/GuessWord-v0", entry_point=GuessWord, max_episode_steps=16)
gymnasium.register("textgames/Corridor-v0", entry_point=Corridor, max_episode_steps=10)
gymnasium.register("textgames/Pendulumish-v0", entry_point=Pendulumish)
