"""Mixture-of-experts models: the tiny Qwen3-MoE, its routers recorded and replayed (engine/model/moe.py, R3)."""

from __future__ import annotations

import pytest
import torch

from grpo_studio.benchmarks.tiny_moe import build_tiny_moe
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model import moe


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    return build_tiny_moe(tmp_path_factory.mktemp("tiny-moe"))


def load(folder, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def own_routes(model, ids) -> torch.Tensor:
    """The experts the model picks itself for `ids` [B, S]: [B, S, L, k]."""
    recorder = moe.RouteRecorder(model)
    with torch.no_grad():
        model(ids)
    recorder.remove()
    return torch.stack(recorder.calls[0], 1).view(*ids.shape, -1, 2)


def hand_forced_logits(model, ids, forced) -> torch.Tensor:
    """The logits with every router's forward replaced by hand: its logits, the `forced` experts, the gate
    weights softmax-gathered from its logits and renormalised (the router's own formula on given indices)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    layer = {id(r): i for i, r in enumerate(moe.routers(model))}

    def forward(self, hidden):
        logits = torch.nn.functional.linear(hidden.reshape(-1, self.hidden_dim), self.weight)
        experts = forced[:, :, layer[id(self)]].reshape(-1, self.top_k)
        weights = torch.softmax(logits, -1, dtype=torch.float).gather(-1, experts)
        return logits, (weights / weights.sum(-1, keepdim=True)).to(logits.dtype), experts

    original = Qwen3MoeTopKRouter.forward
    Qwen3MoeTopKRouter.forward = forward
    try:
        return model(ids).logits
    finally:
        Qwen3MoeTopKRouter.forward = original


def test_replay_equals_a_hand_forced_forward_and_the_router_trains(moe_folder):
    model = load(moe_folder)
    ids = torch.randint(3, 64, (3, 10), generator=torch.Generator().manual_seed(1))
    own = own_routes(model, ids)
    forced = (own + 3) % 8  # another expert set at every token: experts e+3, e'+3 stay distinct
    with torch.no_grad():
        expected = hand_forced_logits(model, ids, forced)
    replay = moe.RouterReplay(model, replay=True)
    replay.use(forced)
    model.train()
    logits = model(ids).logits
    assert torch.equal(logits.detach(), expected)
    assert replay.disagreement() == [0.0, 0.0]  # every token used the sampler's experts
    logits.log_softmax(-1)[..., 5].sum().backward()
    for router in moe.routers(model):
        assert router.weight.grad is not None and router.weight.grad.norm() > 0
    replay.remove()
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, expected)  # hooks gone: the model's own routing again


def test_replay_keeps_own_top_k_where_no_route(moe_folder):
    model = load(moe_folder)
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = model(ids).logits
        replay = moe.RouterReplay(model, replay=True)
        replay.use(torch.full((2, 8, 2, 2), -1))
        assert torch.equal(model(ids).logits, plain)
        assert all(d != d for d in replay.disagreement())  # nothing compared: nan
        replay.remove()


def test_compare_only_counts_tokens_whose_expert_sets_differ(moe_folder):
    model = load(moe_folder)
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(3))
    own = own_routes(model, ids)
    given = own.flip(-1).clone()  # the same sets in another order: agree
    given[0, :3, 0] = (own[0, :3, 0] + 3) % 8  # 3 of 12 tokens differ in layer 0
    given[1, 5, 1] = -1  # one token of layer 1 not compared
    replay = moe.RouterReplay(model, replay=False)
    replay.use(given)
    with torch.no_grad():
        plain = model(ids).logits
    assert replay.disagreement() == [3 / 12, 0.0]
    assert replay.compared.tolist() == [12, 11]
    replay.remove()
    assert torch.equal(load(moe_folder)(ids).logits, plain)  # compare-only leaves the forward alone


def test_router_disagreement_split_by_policy_lag_by_hand():
    """Synthetic routes, 5 tokens, 2 layers, lags 0 0 0 1 2 (rollout.async_mode): the lag-0 tokens are compared
    5 times (one unrouted in layer 1), 2 differ; the lagged ones 4 times, 2 differ."""
    from grpo_studio.engine.precision.mismatch import router_lag_counts, router_lag_metrics

    sampler = torch.tensor([[[0, 1], [2, 3], [4, 5], [6, 7], [0, 2]], [[0, 1], [-1, -1], [3, 4], [5, 6], [7, 0]]])
    trainer = torch.tensor([[[1, 0], [2, 4], [4, 5], [6, 7], [1, 2]], [[0, 1], [2, 3], [3, 5], [5, 7], [0, 7]]])
    # layer 0: tokens 1 and 4 differ (token 0: the same set in another order); layer 1: tokens 2 and 3
    lags = torch.tensor([0, 0, 0, 1, 2])
    counts = sum(
        router_lag_counts((s >= 0).all(-1) & (t >= 0).all(-1), moe.differs(s, t), lags)
        for s, t in zip(sampler, trainer)
    )
    assert counts.tolist() == [[5, 2], [4, 2]]
    assert router_lag_metrics(counts) == {
        "mismatch/lag0/router_disagree": 2 / 5,
        "mismatch/lagged/router_disagree": 2 / 4,
    }
    assert router_lag_metrics(torch.tensor([[5, 2], [0, 0]])) == {"mismatch/lag0/router_disagree": 2 / 5}


def test_router_hooks_count_disagreement_by_each_positions_lag(moe_folder):
    """The hooks on a real forward: layer 0 of row 0 differs at its first 3 positions; the row's prompt (4
    positions) has its first completion token's lag 1, its completion lags 1 1 2 2 → all 3 lagged; row 1 at
    lag 0 agrees. Lagged: 3 of 16 compared (8 positions × 2 layers); lag 0: 0 of 16."""
    model = load(moe_folder)
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(4))
    own = own_routes(model, ids)
    given = own.clone()
    given[0, :3, 0] = (own[0, :3, 0] + 3) % 8
    lags = moe.position_lags(torch.tensor([[1, 1, 2, 2, 7], [0, 0, 0, 0, 0]]), 4, 4)
    assert lags.tolist() == [[1, 1, 1, 1, 1, 1, 2, 2], [0] * 8]
    replay = moe.RouterReplay(model, replay=False)
    replay.use(given, lags)
    with torch.no_grad():
        model(ids)
    metrics = replay.metrics()
    assert metrics["mismatch/lagged/router_disagree"] == 3 / 16
    assert metrics["mismatch/lag0/router_disagree"] == 0.0
    replay.reset()
    assert replay.metrics() == {}


def test_disagreement_by_hand():
    a = torch.tensor([[[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]]]])  # [1, 4 positions, 1 layer, k=2]
    b = torch.tensor([[[[1, 0]], [[2, 4]], [[-1, -1]], [[7, 5]]]])
    # position 0 the same set, 1 and 3 differ, 2 unrouted: 2 of 3
    assert moe.disagreement(a, b) == [pytest.approx(2 / 3)]


def test_routes_layout_slices_like_the_trainer():
    prompt = torch.arange(4).view(1, 4, 1, 1).expand(2, 4, 1, 2).clone()  # right-aligned prompts
    completion = (10 + torch.arange(3)).view(1, 3, 1, 1).expand(2, 3, 1, 2).clone()
    routes = moe.Routes(prompt, completion)
    cut = routes.layout(torch.tensor([1]), 2, 2)  # trim: the last 2 prompt columns, the first 2 completion
    assert cut[0, :, 0, 0].tolist() == [2, 3, 10, 11]
    wide = routes.layout(None, 6, 3)  # a wider prompt layout: -1 on the left
    assert wide[0, :, 0, 0].tolist() == [-1, -1, 0, 1, 2, 3, 10, 11, 12]


def test_hf_sampler_records_the_experts_its_forward_used(moe_folder):
    """The routes the hf sampler records from its own generate (prompt cache, then one token per call) are
    the experts a teacher-forced fp32 forward of the same fp32 weights picks for the same tokens."""
    from types import SimpleNamespace

    from grpo_studio.engine.model.policy_loader import load_tokenizer
    from grpo_studio.engine.rollout.batching import join_prompt_completion
    from grpo_studio.engine.sampler.base import Sampling
    from grpo_studio.engine.sampler.hf import HFBackend

    tokenizer = load_tokenizer(str(moe_folder))
    sampler = HFBackend(str(moe_folder), tokenizer, SimpleNamespace(rollout_dtype="fp32", rollout_fp8=False))
    prompts = [tokenizer.encode("12+3="), tokenizer.encode("7+45=")[:4]]
    out = sampler.generate(prompts, Sampling(n=3, max_tokens=6, temperature=1.0, seed=0))
    routes = out.routes
    assert routes.prompt.shape[:2] == (6, 5) and routes.completion.shape[:2] == out.completion_ids.shape
    assert (routes.prompt[3:, 0] == -1).all()  # the short prompt's left padding
    ids, attention = join_prompt_completion(prompts, out.completion_ids, 3, tokenizer.pad_token_id)
    model = load(moe_folder)
    replay = moe.RouterReplay(model, replay=False)
    replay.use(routes.layout(None, 5, out.completion_ids.shape[1]))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0))
    assert replay.disagreement() == [0.0, 0.0]
    compared = int(attention[:, :5].sum() + out.mask.sum()) - int((out.mask.sum(1) == 6).sum())  # last never fed
    assert replay.compared.tolist() == [compared, compared]


def test_dense_and_unsupported_models_are_refused_in_one_line():
    from transformers import LlamaConfig, MixtralConfig, Qwen3MoeConfig

    with pytest.raises(
        UserError, match=r"^config error: algo.router_replay = 'replay': .*model_type 'llama' has no experts;"
    ):
        moe.check_routers(LlamaConfig(), "algo.router_replay", "replay")
    with pytest.raises(
        UserError,
        match=r"^config error: algo.router_replay = 'replay': the routers of MoE model_type 'mixtral' are not sup",
    ):
        moe.check_routers(MixtralConfig(), "algo.router_replay", "replay")
    moe.check_routers(Qwen3MoeConfig(), "algo.router_replay", "replay")


def train(moe_folder, run_dir, *settings) -> list[dict]:
    """Two steps of the tiny-arith recipe on the tiny MoE, headless, rewarded by completion length (the random
    model never answers; lengths differ inside a group, so the update is not 0); the metrics rows."""
    import json

    from tests.cli_helpers import run_cli

    reward = run_dir.parent / "length_reward.py"
    reward.write_text("def length(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    sets = [f"model.name={moe_folder}", "train.steps=2", "train.prompts_per_step=4", "rollout.num_generations=4"]
    sets += [f"rewards.funcs={reward}:length", "train.eval_every=0", "train.save_every=0", *settings]
    args = [x for s in sets for x in ("--set", s)]
    done = run_cli("train", "tiny-arith", "--run-dir", str(run_dir), *args, cwd=run_dir.parent, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("lora_rank", [8, 0])
def test_the_tiny_moe_trains_with_lora_and_full_fine_tuning(moe_folder, tmp_path, lora_rank):
    """LoRA reaches the fused experts and the router (peft's target_parameters from all-linear) and the merged
    weights reach the sampler: its μ and the trainer's π agree at fp32 noise after the update's sync."""
    rows = train(moe_folder, tmp_path / "run", f"model.lora_rank={lora_rank}")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["grad_norm"] > 0
    assert rows[1]["mismatch/k3"] < 1e-9  # step 2 samples with step 1's weights, synced under their HF names
    assert rows[1]["mismatch/router_disagree"] == 0.0  # fp32 both sides: the same experts


def test_router_replay_closes_the_bf16_routing_gap(moe_folder, tmp_path):
    """A bf16 sampler against the fp32 trainer: some tokens go to other experts; with algo.router_replay =
    replay the trainer uses the sampler's experts: no token differs."""
    off = train(moe_folder, tmp_path / "off", "rollout.dtype=bf16", "algo.router_replay=off")
    on = train(moe_folder, tmp_path / "on", "rollout.dtype=bf16", "algo.router_replay=replay")
    assert off[0]["mismatch/router_disagree"] > 0
    assert {k: v for k, v in on[0].items() if k.startswith("mismatch/router_disagree")} == {
        "mismatch/router_disagree": 0.0,
        "mismatch/router_disagree/layer0": 0.0,
        "mismatch/router_disagree/layer1": 0.0,
    }
    # step 1: the same rollout; π differs only by the routing (how much k3 drops: bench mismatch --moe)
    assert on[0]["mismatch/k3"] != off[0]["mismatch/k3"]
    # the studio's Mismatch tab charts it, per layer, for both runs (0 included: replay's)
    from grpo_studio.studio.panels import PANELS
    from grpo_studio.studio.rundata import RunData

    for name, rows in (("off", off), ("on", on)):
        run = RunData(tmp_path / name)
        run.drain()
        lines = PANELS["router"].lines(run)
        assert PANELS["router"].present(run)
        assert [line.label for line in lines] == [
            "router_disagree",
            "router_disagree/layer0",
            "router_disagree/layer1",
        ]
        assert lines[0].ys == [r["mismatch/router_disagree"] for r in rows]


def test_bench_mismatch_moe_rows_with_and_without_replay():
    """`bench mismatch --moe` on the tiny MoE, bf16 both sides (fp32 master weights under autocast against the
    sampler's bf16 copy): some tokens' experts differ without replay, none with it, and k3 drops."""
    from grpo_studio.benchmarks import mismatch_bench

    report = mismatch_bench.run(["bf16"], moe=True, prompts=32, generations=4, max_tokens=24)
    off, on = report["results"]["bf16"], report["results"]["bf16 replay"]
    assert off["mismatch/router_disagree"] > 0 and on["mismatch/router_disagree"] == 0.0
    assert on["mismatch/k3"] < off["mismatch/k3"]
    with pytest.raises(UserError, match="--moe"):
        mismatch_bench.run(["bf16"], moe=True, backend="vllm")


# ---- the planner: MoE cards, weights and LoRA counted against real models ----------------------------------


def tiny_olmoe(folder):
    from transformers import OlmoeConfig, OlmoeForCausalLM

    torch.manual_seed(0)
    config = OlmoeConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    OlmoeForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", ["qwen3_moe", "olmoe"])
def test_planner_counts_moe_weights_and_lora_like_peft(moe_folder, tmp_path, family):
    """The card read from config.json counts the real model's parameters, and LoRA on all-linear counts what
    peft builds: attention, the fused experts as 3-D parameters (gate_up at twice the rank) and the router."""
    from peft import LoraConfig, get_peft_model

    from grpo_studio.contract import model_card

    folder = moe_folder if family == "qwen3_moe" else tiny_olmoe(tmp_path / "olmoe")
    card = model_card.load(str(folder))
    model = load(folder)
    assert card.family == family and card.total_params() == sum(p.numel() for p in model.parameters())
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    lora = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
    assert card.lora_params(4, ["all-linear"]) == lora


def test_moe_cards_give_total_and_active_weights_to_the_vram_panel():
    """Qwen3-30B-A3B and OLMoE-1B-7B: the published totals (30.5B, 6.92B); active per token as their authors
    count it (with the input embedding: 3.3B, 1.3B); the VRAM panel says both, a dense model neither."""
    from grpo_studio.contract import config, model_card
    from grpo_studio.studio import vram_adapter

    for name, total, active in (("qwen3-30b-a3b", 30.5e9, 3.3e9), ("olmoe-1b-7b", 6.92e9, 1.3e9)):
        card = model_card.load(name)
        assert card.total_params() == pytest.approx(total, rel=2e-3)
        assert card.active_params_per_token() + card.vocab * card.hidden == pytest.approx(active, rel=2e-2)
    plan = vram_adapter.plan(config.load("tiny-arith", ["model.name=qwen3-30b-a3b"]), "accurate", 80.0, solve=False)
    assert plan.params == "30.5B params, 3.03B active per token (8 of 128 experts)"
    assert vram_adapter.plan(config.load("tiny-arith", ["model.name=qwen3-8b"]), "accurate", 80.0).params == ""
