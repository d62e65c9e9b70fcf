"""The embedded torch engine on one GPU, measured against Hugging Face in the same run (see torch_engine.sh).

For each model shape (random weights built from a config: nothing is downloaded):
- HF ``generate`` in bf16, batch 64 x 128 new tokens: the dynamic cache, and the static cache that
  transformers compiles with torch.compile (its first call, compile included, is reported apart);
- ``swarm serve --device cuda --dtype bfloat16`` (static slot cache + CUDA graphs): 64 concurrent chat
  calls x 128 tokens (``ignore_eos``) through the HTTP endpoint, best of two bursts after a warm one;
- one GRPO iteration (8 prompts x 8 samples x 64 tokens: generate, score, update) in process, and the
  same with TRL's ``GRPOTrainer`` (HF generate, bf16 mixed precision, same lr and lengths).

Prints per model ``RESULT model=<m> swarm_over_hf_generate=<x> swarm_over_hf_static=<x> tokens_per_s=<x>
train_step_s=<x> trl_over_swarm=<x> device=<name>`` and writes everything to ``$OUT/torch_engine.json``.
Usage: ``python tests/gpu/torch_engine.py OUT_DIR [model,...]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out")
WORK = Path(os.environ.get("WORK", "/tmp/swarm-gpu"))
CLIENTS, NEW_TOKENS = int(os.environ.get("CLIENTS", "64")), int(os.environ.get("NEW_TOKENS", "128"))
PROMPTS, GROUP, GRPO_TOKENS, ITERATIONS = 8, 8, 64, int(os.environ.get("ITERATIONS", "3"))
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b-shape": {"architecture": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
                           "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
                           "max_position_embeddings": 4096, "tie_word_embeddings": True, "rope_theta": 1e6,
                           "tokenizer": "tiny-bpe"},
    "smollm2-135m-shape": {"architecture": "llama", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30,
                           "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
                           "max_position_embeddings": 8192, "tie_word_embeddings": True, "rope_theta": 1e5,
                           "tokenizer": "smollm2-135m"},
}
SHAPES = json.loads(os.environ["SHAPES_JSON"]) if "SHAPES_JSON" in os.environ else SHAPES  # a CPU dry run's
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DECODE_CACHE = os.environ.get("DECODE_CACHE", "static")  # the served engine's --decode-cache
HF_VARIANTS = os.environ.get("HF_VARIANTS", "dynamic,static").split(",")
RESULTS: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"}


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def log(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


def save() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "torch_engine.json").write_text(json.dumps(RESULTS, indent=1))


def guarded(name: str, fn: Callable[[], Any]) -> Any:
    """Run one phase; a failure is recorded and the check goes on with the next."""
    started = time.time()
    try:
        return fn()
    except Exception as exc:  # a measuring script reports and continues
        import traceback

        RESULTS[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:500]
        log("ERROR", name, traceback.format_exc()[-2500:])
        return None
    finally:
        RESULTS[f"{name}_s"] = round(time.time() - started, 1)
        save()


def tokenizer_folder(name: str) -> Path:
    """The named model's tokenizer: ``$GPU_TOKENIZERS/<name>`` if given (a 98 MB registry package cannot
    travel to a lent GPU, its 3 MB tokenizer can), else the project's own model resolution."""
    from swarm.models.resolve import resolve_model_folder

    carried = Path(os.environ.get("GPU_TOKENIZERS", ".gpu/tokenizers")) / name
    return carried if carried.is_dir() else resolve_model_folder(name, seed=0)


def build_folder(name: str) -> Path:
    """A random-weight model of the named shape with its tokenizer, as a Hugging Face folder."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = WORK / name
    if (folder / "done").exists():
        return folder
    shape = dict(SHAPES[name])
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder(shape.pop("tokenizer")))
    config = AutoConfig.for_model(shape.pop("architecture"), **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "done").write_text("1")
    return folder


def chat_texts(tokenizer: Any) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"Client {i}: write about {i * 7}."}],
                                          tokenize=False, add_generation_prompt=True) for i in range(CLIENTS)]


def hf_generate(folder: Path, tag: str) -> None:
    """HF generate tokens/s in bf16: dynamic cache, then static cache (compiled by transformers)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(DEVICE).eval()
    encoded = tokenizer(chat_texts(tokenizer), return_tensors="pt", padding=True).to(DEVICE)
    variants = {"dynamic": {}, "static": {"cache_implementation": "static"}}
    for variant, extra in ((v, variants[v]) for v in HF_VARIANTS):
        def generate() -> float:
            synchronize()
            started = time.perf_counter()
            with torch.no_grad():
                model.generate(**encoded, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=True,
                               temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tokenizer.pad_token_id, **extra)
            synchronize()
            return time.perf_counter() - started
        RESULTS[f"{tag}_hf_{variant}_first_s"] = round(generate(), 2)
        RESULTS[f"{tag}_hf_{variant}_tokens_per_s"] = round(CLIENTS * NEW_TOKENS / min(generate(), generate()), 1)
        save()
    model = None  # frees the weights (generate() above is done with them) before the cache is emptied
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(folder: Path, tag: str) -> tuple[subprocess.Popen[bytes], str, str]:
    state, port = WORK / f"state-{tag}", free_port()
    config = WORK / f"{tag}.toml"
    config.write_text(f"max_batch_rows = {CLIENTS}\nmax_inflight_per_key = {4 * CLIENTS}\n")
    command = [sys.executable, "-c", "import sys; sys.argv[0] = 'swarm'; from swarm.cli import main; main()", "serve",
               "--model", str(folder), "--port", str(port), "--state-dir", str(state), "--config", str(config),
               "--device", DEVICE, "--dtype", "bfloat16", "--decode-cache", DECODE_CACHE]
    server = subprocess.Popen(command, stdout=open(OUT / f"server-{tag}.log", "wb"),  # noqa: SIM115 - the server owns it
                              stderr=subprocess.STDOUT)
    url, started = f"http://127.0.0.1:{port}", time.time()
    while time.time() - started < 240:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} (see server-{tag}.log)")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200 and (state / "token").exists():
                RESULTS[f"{tag}_server_start_s"] = round(time.time() - started, 1)
                return server, url, (state / "token").read_text().strip()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not become healthy in 240 s")


async def burst(url: str, token: str, clients: int, max_tokens: int) -> tuple[float, int]:
    """``clients`` concurrent chat calls; returns (seconds, completion tokens)."""
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits,
                                 headers={"Authorization": f"Bearer {token}"}) as http:
        async def one(i: int) -> int:
            reply = await http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"Client {i}: write about {i * 7}."}],
                "max_tokens": max_tokens, "temperature": 1.0, "seed": i, "ignore_eos": True})
            reply.raise_for_status()
            return int(reply.json()["usage"]["completion_tokens"])
        started = time.perf_counter()
        tokens = await asyncio.gather(*(one(i) for i in range(clients)))
        return time.perf_counter() - started, sum(tokens)


def served(folder: Path, tag: str) -> None:
    server, url, token = start_server(folder, tag)
    try:
        RESULTS[f"{tag}_decode_cache"] = DECODE_CACHE
        RESULTS[f"{tag}_served_warm"] = asyncio.run(burst(url, token, CLIENTS, NEW_TOKENS))
        runs = [asyncio.run(burst(url, token, CLIENTS, NEW_TOKENS)) for _ in range(2)]
        RESULTS[f"{tag}_served_runs"] = runs
        RESULTS[f"{tag}_tokens_per_s"] = round(max(tokens / seconds for seconds, tokens in runs), 1)
        status = httpx.get(url + "/api/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
        RESULTS[f"{tag}_status_generator"] = status.get("generator")
        if DEVICE == "cuda":
            RESULTS[f"{tag}_gpu_used_mb"] = round((lambda f, t: (t - f) / 2**20)(*torch.cuda.mem_get_info()))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def grpo_prompts() -> list[str]:
    rng = random.Random(1)
    return ["Write about " + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
            for _ in range((ITERATIONS + 1) * PROMPTS)]


def reward(text: str) -> float:
    return text.count("a") / max(1, len(text))


def swarm_grpo(folder: Path, tag: str) -> None:
    """Seconds per GRPO iteration of the in-process engine (first iteration excluded: graph captures)."""
    from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
    from swarm.backends.torch import TorchBackend

    config = TrainConfig(lr=1e-6, grad_clip=1.0, loss_agg_mode="token-mean")
    backend = TorchBackend.from_model(str(folder), config, seed=0, device=DEVICE, dtype="bfloat16", decode_cache=DECODE_CACHE)
    prompts, times = grpo_prompts(), []
    for iteration in range(ITERATIONS + 1):
        synchronize()
        started = time.perf_counter()
        rows = [backend.encode(p) for p in prompts[iteration * PROMPTS:(iteration + 1) * PROMPTS] for _ in range(GROUP)]
        params = [SamplingParams(max_tokens=GRPO_TOKENS, temperature=1.0, ignore_eos=True)] * len(rows)
        generations = backend.generate(rows, params)
        generated = time.perf_counter()
        scores = [reward(backend.decode(g.token_ids)) for g in generations]
        advantages = backend.advantages(scores, [str(i // GROUP) for i in range(len(rows))], config)
        backend.train_step([TrainSample(p + g.token_ids, [0] * len(p) + [1] * len(g.token_ids),
                                        [0.0] * len(p) + g.logprobs, a)
                            for p, g, a in zip(rows, generations, advantages)], config)
        synchronize()
        if iteration:
            times.append((time.perf_counter() - started, generated - started))
        log(tag, "swarm iteration", iteration, round(time.perf_counter() - started, 2), "s")
    RESULTS[f"{tag}_train_step_s"] = round(statistics.fmean(t for t, _ in times), 3)
    RESULTS[f"{tag}_train_generate_s"] = round(statistics.fmean(g for _, g in times), 3)
    del backend
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def profile(folder: Path, tag: str) -> None:
    """Where a decode step's time goes: torch.profiler over a warm in-process generation (to $OUT)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiled

    from swarm.backends.base import SamplingParams
    from swarm.backends.torch import TorchBackend

    backend = TorchBackend.from_model(str(folder), seed=0, device=DEVICE, dtype="bfloat16", decode_cache=DECODE_CACHE)
    rows = [backend.encode(f"Client {i}: write about {i * 7}.") for i in range(CLIENTS)]
    params = [SamplingParams(max_tokens=32, temperature=1.0, ignore_eos=True)] * len(rows)
    backend.generate(rows, params)
    with profiled(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        backend.generate(rows, params)
    (OUT / f"profile-{tag}.txt").write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25)
                                            + "\n" + prof.key_averages().table(sort_by="self_cpu_time_total",
                                                                               row_limit=25))
    del backend


def trl_grpo(folder: Path, tag: str) -> None:
    """Seconds per GRPO iteration of TRL's GRPOTrainer on the same model, prompts and lengths."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            synchronize()
            self.started = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            synchronize()
            times.append(time.perf_counter() - self.started)

    args = GRPOConfig(output_dir=str(WORK / f"trl-{tag}"), per_device_train_batch_size=PROMPTS * GROUP,
                      num_generations=GROUP, max_completion_length=GRPO_TOKENS, learning_rate=1e-6,
                      lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, beta=0.0, loss_type="dapo",
                      temperature=1.0, top_p=1.0, max_steps=ITERATIONS + 1, logging_steps=1, save_strategy="no",
                      report_to="none", bf16=True, use_cpu=DEVICE == "cpu", disable_tqdm=True, dataloader_num_workers=0,
                      shuffle_dataset=False, seed=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                          reward_funcs=[lambda prompts, completions, **_: [reward(c) for c in completions]], args=args,
                          train_dataset=Dataset.from_dict({"prompt": grpo_prompts()}), processing_class=tokenizer,
                          callbacks=[Timer()])
    trainer.train()
    RESULTS[f"{tag}_trl_step_s"] = round(statistics.fmean(times[1:]), 3)
    del trainer
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def result_line(tag: str) -> str:
    def ratio(top: str, bottom: str) -> str:
        a, b = RESULTS.get(top), RESULTS.get(bottom)
        return f"{a / b:.3f}" if a and b else "nan"
    return (f"RESULT model={tag} swarm_over_hf_generate={ratio(f'{tag}_tokens_per_s', f'{tag}_hf_dynamic_tokens_per_s')} "
            f"swarm_over_hf_static={ratio(f'{tag}_tokens_per_s', f'{tag}_hf_static_tokens_per_s')} "
            f"tokens_per_s={RESULTS.get(f'{tag}_tokens_per_s', 'nan')} "
            f"train_step_s={RESULTS.get(f'{tag}_train_step_s', 'nan')} "
            f"trl_over_swarm={ratio(f'{tag}_trl_step_s', f'{tag}_train_step_s')} device={RESULTS['device'].replace(' ', '_')}")


def main() -> None:
    models = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SHAPES)
    phases = os.environ.get("PHASES", "served,hf,train,trl,profile").split(",")
    WORK.mkdir(parents=True, exist_ok=True)
    log("torch", torch.__version__, RESULTS["device"])
    lines = []
    for tag in models:
        folder = guarded(f"{tag}_build", lambda: build_folder(tag))
        if folder is None:
            continue
        for phase, fn in (("served", served), ("hf", hf_generate), ("train", swarm_grpo), ("trl", trl_grpo),
                          ("profile", profile)):
            if phase in phases:
                log(tag, phase)
                guarded(f"{tag}_{phase}", lambda: fn(folder, tag))
        lines.append(result_line(tag))
        print(lines[-1], flush=True)
    save()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
