"""The client side of a scenario: C concurrent multi-turn conversations streamed through the router
from cluster A, each request with a deadline; every chunk updates the shared progress that the
scenario's trigger waits on (`Traffic.wait_for`).

Turn t+1's prompt is turn t's prompt, the tokens the client got and a new user message. A
conversation ends at its first request that did not complete. Conversations are greedy, except
every `seeded_every`-th (1, 1 + n, ...), which samples with a seed (`seeded_sampling`): a migrated
seeded request must continue the single server's seeded stream token for token.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from sglang_pdd.lab.faults.outcome import RequestRecord, end_of_stream
from sglang_pdd.protocol.reply import ReplyMeta


@dataclass
class TrafficSpec:
    conversations: int = 4
    turns: int = 3
    first_prompt: int = 300  # tokens of turn 1's prompt
    big_prompt: int = 0  # conversation 0's turn-1 prompt instead, when set (a request bigger than a pool)
    user_tokens: int = 48  # tokens of each later user message
    max_new_tokens: int = 64
    deadline_s: float = 300.0  # the client's deadline per request: past it, the request hung
    seed: int = 0
    seeded_every: int = 2  # conversations 1, 1 + n, ... sample with a seed (0: every conversation greedy)

    def sampling(self, conv: int, turn: int) -> dict:
        """The sampling parameters of conversation `conv`'s turn `turn` beyond greedy ({} for greedy)."""
        return seeded_sampling(self.seed * 1000 + 10 * conv + turn) if self.is_seeded(conv) else {}

    def is_seeded(self, conv: int) -> bool:
        return self.seeded_every > 0 and conv % self.seeded_every == 1 % self.seeded_every


def seeded_sampling(seed: int) -> dict:
    """Seeded sampling (every PDD role and the reference sample with sglang-pdd's position-hashed
    sampler, --pdd-seeded-sampling): the same tokens wherever a request is decoded."""
    return {"temperature": 0.8, "top_p": 0.9, "sampling_seed": seed}


class Traffic:
    def __init__(self, url: str, spec: TrafficSpec, prompts, ns):
        self.url, self.spec, self.prompts, self.ns = url, spec, prompts, ns
        self.records: list[RequestRecord] = []
        self.active: list[RequestRecord] = []
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    # -- progress -----------------------------------------------------------------------------
    def wait_for(self, pred, timeout_s: float):
        """Until `pred(self)` is truthy (its value), or None after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                got = pred(self)
                if got or time.monotonic() > deadline:
                    return got or None
                self._cond.wait(0.1)

    def streamed(self) -> int:
        """Tokens the clients have received so far, over every request."""
        return sum(len(r.output_ids) for r in self.records)

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    # -- the conversations --------------------------------------------------------------------
    def start(self) -> "Traffic":
        for c in range(self.spec.conversations):
            t = threading.Thread(target=self._conversation, args=(c,), name=f"faults-conv-{c}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def join(self, timeout_s: float) -> None:
        """Wait for every conversation; a request still running at `timeout_s` is marked hung."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            for r in self.active:
                r.hung = True

    def _conversation(self, c: int) -> None:
        self.ns.enter()
        s = self.spec
        ids = self.prompts.ids(s.big_prompt if c == 0 and s.big_prompt else s.first_prompt, seed=s.seed * 1000 + c)
        for turn in range(s.turns):
            rec = RequestRecord(c, turn, list(ids), s.max_new_tokens, sampling=s.sampling(c, turn))
            with self._cond:
                self.records.append(rec)
                self.active.append(rec)
            request(self.url, rec, s.deadline_s, self._progress)
            with self._cond:
                self.active.remove(rec)
                self._cond.notify_all()
            if not rec.completed:
                return
            ids = ids + rec.output_ids + self.prompts.ids(s.user_tokens, seed=s.seed * 1000 + 100 * (turn + 1) + c)

    def _progress(self) -> None:
        with self._cond:
            self._cond.notify_all()


def request(url: str, rec: RequestRecord, deadline_s: float, on_chunk=lambda: None) -> RequestRecord:
    """One streamed /generate (greedy, or `rec.sampling`), recorded in `rec` as it comes (the caller's thread)."""
    body = {"input_ids": rec.input_ids, "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": rec.max_new_tokens, "ignore_eos": True,
                                **rec.sampling}}
    req = urllib.request.Request(url.rstrip("/") + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = last = time.monotonic()
    done = False
    try:
        with urllib.request.urlopen(req, timeout=deadline_s) as r:
            for raw in r:
                line = raw.decode().strip()
                done = done or line == "data: [DONE]"
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                now = time.monotonic()
                if "error" in chunk:
                    err = chunk["error"]
                    rec.error = f"error chunk {err.get('code')}: {err.get('message') or '(no message)'}"
                    break
                got = chunk.get("output_ids") or []
                if got[:len(rec.output_ids)] != rec.output_ids:
                    rec.went_back = True
                if got and rec.ttft_s is None:
                    rec.ttft_s = now - t0
                elif got:
                    rec.gap_s = max(rec.gap_s, now - last)
                last = now
                rec.output_ids = list(got)
                meta = chunk.get("meta_info") or {}
                pdd = ReplyMeta.of(meta) or ReplyMeta()  # a garbled one: a malformed stream (ValueError)
                rec.migrations = pdd.migrations
                rec.causes = list(pdd.migration_causes)
                rec.handoff_tokens = pdd.handoff_tokens
                rec.md = pdd.md.index if pdd.md else None
                if meta.get("finish_reason") is not None:
                    rec.finish_reason = meta["finish_reason"]
                on_chunk()
                if now - t0 > deadline_s:
                    rec.hung = True
                    break
    except urllib.error.HTTPError as e:
        rec.error = f"HTTP {e.code}: {e.read().decode(errors='replace')[:200]}"
    except TimeoutError:
        rec.hung = True
    except OSError as e:  # the connection refused, reset or cut (a dead router)
        if "timed out" in str(e):
            rec.hung = True
        else:
            rec.error = f"connection: {e}"
    except http.client.HTTPException as e:  # the stream cut mid-chunk
        rec.error = f"connection: {type(e).__name__} {e}"
    except ValueError as e:
        rec.error = f"malformed stream: {e}"
    end_of_stream(rec, done)
    rec.e2e_s = time.monotonic() - t0
    return rec
