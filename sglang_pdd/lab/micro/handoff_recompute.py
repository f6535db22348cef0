"""MD's side of the token-ID handoff: recompute the k eager tokens' KV in ONE extend forward over a cached
prefix, on this machine's CPU. Two engines, same contract (`prepare()` untimed, `__call__(ids)` timed):

  sglang        sglang's own `ModelRunner` in-process, driven the way `sglang.benchmark.one_batch` does
                (CPU flags of `testing.launch_args`: torch_native attention, fp32, page size 1): an
                EXTEND batch of the prefix fills the KV pool, then the timed EXTEND batch has
                prefix_len = prefix and extend_len = k, which is what MD's handoff batch is. `prepare()`
                clears the pools and prefills the prefix again (the pools keep no state between rounds).
  transformers  a `StaticCache` sized prefix + k: the prefix once, then each call writes the k tokens'
                KV in place after it and attends over prefix + themselves; logits of the last position.

`check(ids)` returns the max |logit difference| between the extend over the cached prefix and one
forward of prefix + ids, which proves the prefix really came from the cache.
"""

from __future__ import annotations

import logging
import os
from array import array
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)


class Recompute(Protocol):
    engine_name: str

    def prepare(self) -> None: ...

    def __call__(self, ids: list[int]) -> torch.Tensor: ...

    def check(self, ids: list[int]) -> float: ...


class TransformersRecompute:
    def __init__(self, model_dir: str, prefix_ids: list[int], tokens: int):
        import transformers
        from transformers import AutoModelForCausalLM, StaticCache

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.prefix_ids = prefix_ids
        self.cache = StaticCache(config=self.model.config, max_cache_len=len(prefix_ids) + tokens)
        self.positions = torch.arange(len(prefix_ids), len(prefix_ids) + tokens)
        with torch.inference_mode():
            self.model(torch.tensor([prefix_ids]), past_key_values=self.cache,
                       cache_position=torch.arange(len(prefix_ids)), use_cache=True, logits_to_keep=1)
        self.engine_name = (f"transformers {transformers.__version__} ({self.model.config._attn_implementation}), "
                            f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    def prepare(self) -> None:
        for layer in self.cache.layers:  # the next call writes right after the prefix again
            layer.cumulative_length.fill_(len(self.prefix_ids))

    def __call__(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(torch.tensor([ids]), past_key_values=self.cache,
                             cache_position=self.positions[: len(ids)], use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def check(self, ids: list[int]) -> float:
        with torch.inference_mode():
            full = self.model(torch.tensor([self.prefix_ids + ids]), logits_to_keep=1).logits[0, -1]
        self.prepare()
        return float((self(ids) - full).abs().max())


class SglangRecompute:
    def __init__(self, model_dir: str, prefix_ids: list[int], tokens: int):
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        import sglang
        from sglang.benchmark import one_batch as ob
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import PortArgs, ServerArgs

        server_args = ServerArgs(
            model_path=model_dir, tokenizer_path=model_dir, device="cpu", attention_backend="torch_native",
            sampling_backend="pytorch", dtype="float32", max_total_tokens=4 * (len(prefix_ids) + tokens) + 1024,
            mem_fraction_static=0.3, disable_cuda_graph=True, grammar_backend="none",
            disable_overlap_schedule=True, page_size=1)
        server_args.resolve_once()
        ob._set_envs_and_config(server_args)
        ob.publish(server_args, role="scheduler", ranks=ob.SpawnRanks(
            world_rank=ob.spawn_world_rank(server_args, tp_rank=0, pp_rank=0), gpu_id=0))
        ob._init_process_global_configs()
        self.runner, _ = ob.load_model(server_args, PortArgs.init_new(server_args), 0, 0)
        self._req_cls = ob.Req
        self._params = SamplingParams(temperature=0, max_new_tokens=1)
        self.prefix_ids = prefix_ids
        self._req: Any = None
        self.engine_name = (f"sglang {sglang.__version__} ModelRunner (torch_native attention, page 1), "
                            f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    def _new_req(self, ids: list[int]) -> Any:
        req = self._req_cls(rid="handoff", origin_input_text="", origin_input_ids=array("q", ids),
                            sampling_params=self._params)
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.extend_end = len(ids)
        return req

    def prepare(self) -> None:
        self.runner.clear()
        self._req = self._new_req(self.prefix_ids)
        self.runner.extend([self._req])

    def __call__(self, ids: list[int]) -> torch.Tensor:
        req = self._req
        req.full_untruncated_fill_ids.extend(ids)
        req.prefix_len = len(self.prefix_ids)
        req.logprob_start_len = -1
        req.extend_end = len(req.full_untruncated_fill_ids)
        _, logits, _ = self.runner.extend([req])
        return logits[0]

    def check(self, ids: list[int]) -> float:
        self.prepare()
        extended = self(ids)
        self.runner.clear()
        _, full, _ = self.runner.extend([self._new_req(self.prefix_ids + ids)])
        return float((extended - full[0]).abs().max())


def make_recompute(engine: str, model_dir: str, prefix_ids: list[int], tokens: int) -> Recompute:
    if engine == "sglang":
        return SglangRecompute(model_dir, prefix_ids, tokens)
    if engine == "transformers":
        return TransformersRecompute(model_dir, prefix_ids, tokens)
    raise ValueError(f"unknown recompute engine {engine!r}")
