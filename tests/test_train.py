"""Gradient fallback on a tiny model built from a config here (no download), on the CPU, through TRL and PEFT."""

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from conftest import run_cli  # noqa: E402
from gym_tf.backends.transformers_local import TransformersBackend  # noqa: E402
from gym_tf.errors import ConfigError  # noqa: E402
from gym_tf.store import RunStore  # noqa: E402
from gym_tf.train import (  # noqa: E402
    TrainConfig, checkpointing_option, resume_train_config, train, trl_args, trl_reward,
)
from rewards import majority_vote, regex_match  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target = tmp_path_factory.mktemp("tiny-qwen2")
    subprocess.run([sys.executable, str(TESTS / "tiny_model.py"), str(target)], check=True, capture_output=True)
    return target


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Rewarded by the real `regex` reward: a random model writes a digit in some samples and not in others."""
    path = tmp_path_factory.mktemp("data") / "digits.jsonl"
    path.write_text("\n".join(json.dumps({"problem": f"Write a number ({i})", "answer": str(i), "pattern": "[0-9]"})
                              for i in range(8)))
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def config(tiny, digits, tmp_path, **overrides):
    base = dict(model=str(tiny), dataset=str(digits), reward="regex", max_steps=2, group_size=4, prompts_per_step=2,
                max_completion_tokens=12, num_iterations=2, learning_rate=1e-2, output_dir=str(tmp_path / "out"))
    return TrainConfig(**{**base, **overrides})


def test_gspo_lora_trains_and_leaves_base_weights_bit_identical(tiny, digits, tmp_path):
    before = digest(tiny / "model.safetensors")
    store = RunStore(tmp_path / "ws")
    run_id, out = train(config(tiny, digits, tmp_path, method="gspo", lora=True), store)
    assert digest(tiny / "model.safetensors") == before
    adapter = load_file(out / "adapter_model.safetensors")
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # B starts at zero: nonzero means it learned
    steps = store.steps(run_id)
    assert [s["step"] for s in steps] == [1, 2] and all("loss" in s["stats"] for s in steps)
    assert "reward" in steps[0]["stats"] and steps[0]["stats"]["num_tokens"] > 0  # step 2 re-uses step 1's samples
    assert store.run(run_id)["kind"] == "train" and store.run(run_id)["status"] == "finished"
    # base weights inside the adapted model are still the originals
    original = load_file(tiny / "model.safetensors")
    reloaded = TransformersBackend(str(out))
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in reloaded.lm.state_dict().items() if "lora_" not in k}
    assert original and original.keys() <= base.keys()  # every original weight found, so each one is compared
    assert all(torch.equal(base[k], v) for k, v in original.items())


def test_full_finetuning_changes_the_parameters(tiny, digits, tmp_path):
    _, out = train(config(tiny, digits, tmp_path, method="grpo"), RunStore(tmp_path / "ws"))
    before, after = load_file(tiny / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


def test_adapter_saves_and_reloads_to_identical_outputs(tiny, digits, tmp_path):
    _, out = train(config(tiny, digits, tmp_path, lora=True, max_steps=1), RunStore(tmp_path / "ws"))
    messages = [{"role": "user", "content": "Write a number"}]
    first, second = (asyncio.run(TransformersBackend(str(out)).generate(messages, n=1, temperature=0.0, max_tokens=10))
                     for _ in range(2))
    assert first.choices[0].text == second.choices[0].text and first.completion_tokens > 0


def test_gspo_and_grpo_differ_in_the_importance_ratio(tiny, digits, tmp_path):
    gspo, grpo = (trl_args(config(tiny, digits, tmp_path, method=m)) for m in ("gspo", "grpo"))
    assert (gspo.importance_sampling_level, grpo.importance_sampling_level) == ("sequence", "token")
    assert gspo.epsilon < grpo.epsilon  # GSPO clips a sequence ratio in a far tighter range
    # the same seed, data and steps: different objectives give different weights
    a = train(config(tiny, digits, tmp_path / "a", method="gspo", learning_rate=1e-2), RunStore(tmp_path / "wa"))[1]
    b = train(config(tiny, digits, tmp_path / "b", method="grpo", learning_rate=1e-2), RunStore(tmp_path / "wb"))[1]
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)


def test_rewards_are_called_once_per_group():
    seen = []

    def reward(completions, **row):
        seen.append((list(completions), row["answer"]))
        return majority_vote(completions)

    score = trl_reward(reward, group_size=2)
    out = score(prompts=["p", "p", "q", "q"], completions=[[{"content": "\\boxed{1}"}], [{"content": "\\boxed{1}"}],
                                                           [{"content": "\\boxed{2}"}], [{"content": "no"}]],
                answer=["1", "1", "2", "2"])
    assert out == [1.0, 1.0, 1.0, 0.0] and [a for _, a in seen] == ["1", "2"]
    assert trl_reward(regex_match, 1)(prompts=["p"], completions=["7"], pattern=["[0-9]"]) == [1.0]


def test_resume_continues_the_same_run_from_its_last_checkpoint(tiny, digits, tmp_path):
    store = RunStore(tmp_path / "ws")
    cfg = config(tiny, digits, tmp_path, lora=True, max_steps=2, save_steps=2, num_iterations=1)
    run_id, _ = train(cfg, store)
    first_two = store.steps(run_id)
    resumed, cfg_again = resume_train_config(store, run_id[-6:], max_steps=3)
    assert resumed == run_id and cfg_again == cfg.model_copy(update={"max_steps": 3})
    assert train(cfg_again, store, run_id=resumed)[0] == run_id
    assert [r["id"] for r in store.runs()] == [run_id] and store.run(run_id)["status"] == "finished"
    steps = store.steps(run_id)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[:2] == first_two  # steps 1-2 came from the checkpoint, not retrained (they would be rewritten)


def test_resume_without_a_checkpoint_is_refused_not_started_over(tiny, digits, tmp_path):
    store = RunStore(tmp_path / "ws")
    cfg = config(tiny, digits, tmp_path)
    run_id = store.new_run("train", cfg.model_dump(mode="json"), "tiny", str(digits), "")
    store.finish_run(run_id, "failed", {})  # as a run that died before its first checkpoint
    with pytest.raises(ConfigError, match=f"run {run_id} has no checkpoint in .*out to resume from"):
        train(cfg, store, run_id=run_id)
    done = run_cli("train", "--resume", run_id, "--workspace", str(tmp_path / "ws"))
    assert done.returncode == 1 and f"error: run {run_id} has no checkpoint" in done.stderr
    assert [r["id"] for r in store.runs()] == [run_id] and store.steps(run_id) == []
    assert not (tmp_path / "out").exists()
    missing = run_cli("train", "--workspace", str(tmp_path / "ws"))
    assert missing.returncode == 1 and "--model is required" in missing.stderr


def test_cli_train_gspo_lora_then_eval_with_transformers(tiny, digits, tmp_path):
    ws, out = tmp_path / "ws", tmp_path / "out"
    done = run_cli("train", "--method", "gspo", "--lora", "--merge", "--model", str(tiny), "--dataset", str(digits),
                   "--reward", "regex", "--max-steps", "2", "-G", "2", "--max-completion-tokens", "8",
                   "--output", str(out), "--workspace", str(ws))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "adapter" / "adapter_config.json").exists() and (out / "merged" / "model.safetensors").exists()
    for model_dir in (out / "adapter", out / "merged"):
        report = tmp_path / f"{model_dir.name}.json"
        evaluated = run_cli("eval", "--backend", "transformers", "--model", str(model_dir), "--dataset", str(digits),
                            "--reward", "regex", "--limit", "2", "-k", "2", "--max-completion-tokens", "8",
                            "--report", str(report), "--workspace", str(ws))
        assert evaluated.returncode == 0, evaluated.stderr[-2000:]
        assert "Mean@2" in evaluated.stdout and json.loads(report.read_text())["metrics"]["problems"] == 2
    runs = run_cli("runs", "--workspace", str(ws))
    assert "train" in runs.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on an accelerator machine)")
def test_on_a_gpu_training_uses_bf16_and_activation_checkpointing(tiny, digits, tmp_path):
    cfg = config(tiny, digits, tmp_path, method="gspo", lora=True, max_steps=2)
    args = trl_args(cfg)
    assert args.bf16 and getattr(args, checkpointing_option()) and not args.use_cpu
    store = RunStore(tmp_path / "ws")
    run_id, out = train(cfg, store)
    assert [s["step"] for s in store.steps(run_id)] == [1, 2]
    adapter = load_file(out / "adapter_model.safetensors")
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)
