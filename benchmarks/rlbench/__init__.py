"""RL-Bench: a diagnostic benchmark of how well an agent (or a trainer) post-trains a model.

After the shape of Agent2 RL-Bench: six tasks at three levels (`catalog.py`), each handed out
as an isolated workspace (`workspace.py`) with a base model, train tasks, instructions and a
time budget; a grader on loopback (`server.py`, `grader.py`) scores submitted model folders
on hidden test tasks through a rollout service of its own (`stack.py`, `evaluate.py`);
everything is recorded (`records.py`) and summarized afterwards (`summary.py`).
See README.md here, and `python -m benchmarks.rlbench --help`.
"""
