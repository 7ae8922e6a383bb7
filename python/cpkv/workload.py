"""A seeded synthetic workload in the Mooncake trace format.

The two bundled traces are the only real data; a policy tuned on them must
also be judged on data it was not tuned on, and tests need small traces
whose structure is known. This module
makes one from a seed, as a pure function of its arguments (its own
``random.Random``, no clock, no ``hash()``), with five request families:

- ``chat``: multi-turn conversations over a few shared system prompts. Turn
  ``t + 1``'s prompt is turn ``t``'s prompt, its answer and new user text, so
  it extends turn ``t``'s block chain; turns come back after a human think
  time (seconds), interleaved with other sessions.
- ``document``: one-shot long prompts (a pasted document), unique and never
  reused: blocks a cache should not keep.
- ``agent``: tool loops over a few long tool-spec prompts. Each step appends
  a short action and a long tool output and comes back within tool latency
  (a burst); some steps fan out into parallel calls sharing the prefix at one
  timestamp, of which the loop continues one.
- ``tool``: agent loops whose tools return long outputs (pages of a file, a
  search result): few steps, each adding several blocks, prompts up to 24k
  tokens.
- ``scan``: a batch job scanning documents: a burst of one-shot documents
  arriving back to back, the pattern that flushes a recency-only cache.
- ``docqa``: questions about one long document, asked minutes apart: the
  document is the shared prefix, each question a new leaf.

A workload is a mix of families (:data:`MIXES`, the registry: a new workload
is one more entry) and a pacing (:data:`PACING`: how many times slower than
the base think and tool times sessions come back; slow sessions keep more of
them open at once, so their reuse reaches farther back). ``bursty`` mixes
chat, documents and agents with scan bursts.

Block ids follow the Mooncake rules: a request's block ``i`` covers tokens
``[0, min(512 (i + 1), input_length))``, the last block is usually partial,
equal ids mean equal prefixes, and ids are numbered in order of first use.
"""

from __future__ import annotations

import heapq
import json
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from cpkv.errors import InvalidArgumentError
from cpkv.traces import BLOCK_TOKENS, TraceRequest, blocks_for

__all__ = ["MIXES", "FAMILIES", "generate", "generate_tagged", "write_jsonl", "to_record"]

FAMILIES = ("chat", "document", "agent", "tool", "scan", "docqa")

# Weights of each family among new sessions (not requests: a chat session
# makes ~3 requests, an agent one ~5, a document one exactly one).
MIXES: dict[str, dict[str, float]] = {
    "default": {"chat": 0.5, "document": 0.3, "agent": 0.2},
    "chat": {"chat": 1.0},
    "document": {"document": 1.0},
    "agent": {"agent": 1.0},
    "tool": {"tool": 1.0},
    "scan": {"scan": 1.0},
    "docqa": {"docqa": 0.7, "document": 0.3},
    "slow": {"chat": 0.4, "docqa": 0.2, "agent": 0.15, "tool": 0.1, "document": 0.15},
    "bursty": {"chat": 0.35, "docqa": 0.15, "agent": 0.15, "tool": 0.1, "document": 0.1, "scan": 0.15},
}
# How many times the base gaps between a session's steps (absent: 1).
PACING: dict[str, int] = {"slow": 10, "bursty": 10, "docqa": 1}

# Sizes in tokens, small on purpose: a default mix averages ~5 blocks a request.
CHAT_SYSTEM_PROMPTS = 3
CHAT_SYSTEM_TOKENS = (512, 2048)  # at least one full shared block each
CHAT_TURNS = (1, 6)
CHAT_FIRST_USER_TOKENS = (50, 800)
CHAT_USER_TOKENS = (20, 300)
CHAT_ANSWER_TOKENS = (50, 500)
CHAT_THINK_MS = (3_000, 60_000)
DOCUMENT_TOKENS = (2_048, 6_144)
DOCUMENT_ANSWER_TOKENS = (100, 400)
AGENT_SYSTEM_PROMPTS = 2
AGENT_SYSTEM_TOKENS = (1_024, 2_560)
AGENT_STEPS = (3, 8)
AGENT_TASK_TOKENS = (50, 400)
AGENT_ACTION_TOKENS = (30, 150)
AGENT_TOOL_TOKENS = (200, 1_500)
AGENT_TOOL_MS = (50, 2_000)
AGENT_FANOUT_P = 0.25
AGENT_FANOUT = (2, 4)
TOOL_STEPS = (2, 5)
TOOL_OUTPUT_TOKENS = (2_048, 6_144)
TOOL_MAX_PROMPT_TOKENS = 24_576
SCAN_DOCUMENTS = (20, 60)
SCAN_GAP_MS = (10, 200)
DOCQA_QUESTIONS = (2, 6)
DOCQA_QUESTION_TOKENS = (30, 300)
DOCQA_GAP_MS = (20_000, 300_000)
MAX_PROMPT_TOKENS = 6_144  # a session stops before its prompt outgrows this
SESSION_GAP_MS = 1_500.0  # mean gap between new sessions (Poisson arrivals)
DECODE_MS_PER_TOKEN = 20


@dataclass
class _Stream:
    """A prompt's content as a chain of segments; a segment is one content node.

    Two prompts share tokens ``[0, end)`` exactly when the segment holding
    token ``end - 1`` is the same node, so ``(node, end)`` names a block.
    """

    starts: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    length: int = 0

    def extended(self, node: int, tokens: int) -> _Stream:
        """This stream plus ``tokens`` new tokens of a new content node."""
        return _Stream([*self.starts, self.length], [*self.nodes, node], self.length + tokens)

    def grown(self, tokens: int) -> _Stream:
        """This stream with its last node grown by ``tokens`` (append-only content)."""
        return _Stream(list(self.starts), list(self.nodes), self.length + tokens)


class _Builder:
    """Allocates content nodes and global block ids (in order of first use)."""

    def __init__(self) -> None:
        self.next_node = 0
        self.block_ids: dict[tuple[int, int], int] = {}

    def node(self) -> int:
        self.next_node += 1
        return self.next_node - 1

    def hash_ids(self, stream: _Stream) -> tuple[int, ...]:
        ids = []
        for i in range(blocks_for(stream.length)):
            end = min((i + 1) * BLOCK_TOKENS, stream.length)
            key = (stream.nodes[bisect_right(stream.starts, end - 1) - 1], end)
            ids.append(self.block_ids.setdefault(key, len(self.block_ids)))
        return tuple(ids)


@dataclass
class _Session:
    family: str
    streams: list[_Stream]  # the prompts issued at this step; the session continues from the first
    steps_left: int  # steps after this one


def generate_tagged(num_requests: int, seed: int, mix: str = "default") -> list[tuple[str, TraceRequest]]:
    """Like :func:`generate`, each request with its family (one of :data:`FAMILIES`)."""
    if type(num_requests) is not int or num_requests < 0:
        raise InvalidArgumentError(f"num_requests must be a non-negative integer, got {num_requests!r}")
    # random.Random(-s) equals random.Random(s); refuse negatives rather than alias them.
    if type(seed) is not int or seed < 0:
        raise InvalidArgumentError(f"seed must be a non-negative integer, got {seed!r}")
    if mix not in MIXES:
        raise InvalidArgumentError(f"unknown workload mix {mix!r} (known: {', '.join(MIXES)})")
    rng = random.Random(seed)
    build = _Builder()
    uniform = rng.randint

    def prompts(count: int, sizes: tuple[int, int]) -> list[_Stream]:
        return [_Stream().extended(build.node(), uniform(*sizes)) for _ in range(count)]

    chat_systems = prompts(CHAT_SYSTEM_PROMPTS, CHAT_SYSTEM_TOKENS)
    agent_systems = prompts(AGENT_SYSTEM_PROMPTS, AGENT_SYSTEM_TOKENS)
    families = list(MIXES[mix])
    pacing = PACING.get(mix, 1)
    weights = [MIXES[mix][f] for f in families]

    out: list[tuple[str, TraceRequest]] = []
    # (time ms, sequence number, session or None for "a new session arrives")
    events: list[tuple[int, int, _Session | None]] = [(0, 0, None)]
    seq = 1

    def schedule(at: int, session: _Session | None) -> None:
        nonlocal seq
        heapq.heappush(events, (at, seq, session))
        seq += 1

    def emit(now: int, family: str, stream: _Stream, answer: int) -> None:
        out.append((family, TraceRequest(now, stream.length, answer, build.hash_ids(stream))))

    while len(out) < num_requests:
        now, _, session = heapq.heappop(events)
        if session is None:
            schedule(now + int(rng.expovariate(1.0 / SESSION_GAP_MS)), None)
            family = rng.choices(families, weights)[0]
            if family == "scan":
                session = _Session(family, [], uniform(*SCAN_DOCUMENTS) - 1)
            elif family == "docqa":
                document = _Stream().extended(build.node(), uniform(*DOCUMENT_TOKENS))
                session = _Session(family, [document], uniform(*DOCQA_QUESTIONS) - 1)
            elif family == "document":
                emit(now, family, _Stream().extended(build.node(), uniform(*DOCUMENT_TOKENS)),
                     uniform(*DOCUMENT_ANSWER_TOKENS))
                continue
            else:
                systems = chat_systems if family == "chat" else agent_systems
                opening = CHAT_FIRST_USER_TOKENS if family == "chat" else AGENT_TASK_TOKENS
                steps = {"chat": CHAT_TURNS, "agent": AGENT_STEPS, "tool": TOOL_STEPS}[family]
                first = rng.choice(systems).extended(build.node(), uniform(*opening))
                session = _Session(family, [first], uniform(*steps) - 1)

        if session.family == "scan":
            # One unique document per step, the next one right behind it.
            emit(now, "scan", _Stream().extended(build.node(), uniform(*DOCUMENT_TOKENS)),
                 uniform(*DOCUMENT_ANSWER_TOKENS))
            if session.steps_left > 0:
                schedule(now + uniform(*SCAN_GAP_MS), _Session("scan", [], session.steps_left - 1))
            continue
        if session.family == "docqa":
            # The document (kept as the session's stream) and a new question after it.
            document = session.streams[0]
            emit(now, "docqa", document.extended(build.node(), uniform(*DOCQA_QUESTION_TOKENS)),
                 uniform(*DOCUMENT_ANSWER_TOKENS))
            if session.steps_left > 0:
                schedule(now + pacing * uniform(*DOCQA_GAP_MS), _Session("docqa", [document], session.steps_left - 1))
            continue

        answers = []
        for stream in session.streams:
            if len(out) >= num_requests:
                break
            answer = uniform(*(CHAT_ANSWER_TOKENS if session.family == "chat" else AGENT_ACTION_TOKENS))
            emit(now, session.family, stream, answer)
            answers.append(answer)
        main, answer = session.streams[0], answers[0]
        if session.family == "chat":
            # The next turn: this prompt + the answer + the user's reply, all in this conversation's node.
            nxt = [main.grown(answer + uniform(*CHAT_USER_TOKENS))]
            gap = answer * DECODE_MS_PER_TOKEN + uniform(*CHAT_THINK_MS)
        elif session.family == "tool":
            nxt = [main.grown(answer + uniform(*TOOL_OUTPUT_TOKENS))]
            gap = answer * DECODE_MS_PER_TOKEN + uniform(*AGENT_TOOL_MS)
        else:
            if rng.random() < AGENT_FANOUT_P:
                # Parallel tool calls: one burst of requests sharing prompt + action, differing after.
                acted = main.grown(answer)
                nxt = [acted.extended(build.node(), uniform(*AGENT_TOOL_TOKENS))
                       for _ in range(uniform(*AGENT_FANOUT))]
            else:
                nxt = [main.grown(answer + uniform(*AGENT_TOOL_TOKENS))]
            gap = answer * DECODE_MS_PER_TOKEN + uniform(*AGENT_TOOL_MS)
        limit = TOOL_MAX_PROMPT_TOKENS if session.family == "tool" else MAX_PROMPT_TOKENS
        if session.steps_left > 0 and max(s.length for s in nxt) <= limit:
            schedule(now + pacing * gap, _Session(session.family, nxt, session.steps_left - 1))
    return out


def generate(num_requests: int, seed: int, mix: str = "default") -> list[TraceRequest]:
    """``num_requests`` requests of the ``mix`` workload (see :data:`MIXES`), a pure function of the arguments.

    Timestamps are in ms from 0 and non-decreasing; block ids are chained and
    numbered from 0 in order of first use, as in the Mooncake traces.
    """
    return [req for _, req in generate_tagged(num_requests, seed, mix)]


def to_record(req: TraceRequest) -> dict[str, object]:
    """The JSON record of one request, keys in the Mooncake files' order."""
    return {
        "timestamp": req.timestamp_ms,
        "input_length": req.input_length,
        "output_length": req.output_length,
        "hash_ids": list(req.hash_ids),
    }


def write_jsonl(requests: Iterable[TraceRequest], path: str | Path) -> None:
    """Writes requests as a Mooncake JSONL trace that ``cpkv.traces.load_trace`` reads back."""
    with open(path, "w", encoding="utf-8") as f:
        for req in requests:
            f.write(json.dumps(to_record(req)) + "\n")
