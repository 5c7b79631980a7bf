"""`search_qa`: the answer is reachable by search and open; exact match after normalization."""

from __future__ import annotations

import re

import pytest

from env_workers.envs.bm25 import BM25
from env_workers.envs.search_qa import SearchQAEnv, corpus, normalize, question


def test_bm25_ranks_the_matching_document_first():
    idx = BM25({"a": "the red mug on the table", "b": "a blue shirt", "c": "red red red shirt"})
    assert idx.search("mug", 3)[0][0] == "a" and idx.search("zebra") == []


@pytest.mark.parametrize("seed", range(12))
def test_answer_is_found_by_following_the_documents(seed):
    q, (docs, _) = question(seed), corpus()
    env = SearchQAEnv()
    env.reset({"seed": seed})
    # The entity named in the question: the longest document title it contains.
    entity = max((e["title"] for e in docs.values() if e["title"] in q["question"]), key=len)
    hits = env.step(f"search: {entity}").observation[0].content
    doc = re.search(r"\[(doc-\d+)\] " + re.escape(entity), hits).group(1)
    text = env.step(f"open: {doc}").observation[0].content
    assert entity in text
    if q["hops"] == 2:  # the founder, then where they were born
        founder = re.search(r"by (.+?) and is", text).group(1)
        hits = env.step(f"search: {founder}").observation[0].content
        doc = re.search(r"\[(doc-\d+)\] " + re.escape(founder), hits).group(1)
        text = env.step(f"open: {doc}").observation[0].content
        city = re.search(r"born in \d+ in (\w+)", text).group(1)
        assert city in {e["title"] for e in docs.values()}
    r = env.step(f"answer: {q['answer'].upper()}.")
    assert r.terminated and r.reward == 1.0


def test_wrong_answer_scores_zero_and_junk_is_text():
    env = SearchQAEnv(max_steps=2)
    env.reset({"question": "Capital?", "answer": "The Bravo River"})
    assert "Write one action" in env.step("hmm").observation[0].content
    assert normalize("the  Bravo river!") == normalize("Bravo River")
    assert env.step("answer: Bravo Creek").reward == 0.0


def test_open_of_a_missing_document_is_text():
    env = SearchQAEnv()
    env.reset({"seed": 1})
    assert "No document" in env.step("open: doc-999").observation[0].content
