"""Gradient fallback: GRPO or GSPO on the same datasets and reward callables, with TRL's GRPOTrainer and PEFT LoRA.

Why TRL rather than a trainer of our own: its GRPOTrainer already implements group-relative advantages, the
clipped ratio, the KL to a frozen reference (beta), and GSPO's sequence-level importance ratio
(`importance_sampling_level="sequence"`), and it is maintained against every transformers release. gym-tf adds
the dataset loaders, the reward callables, the run store, progress, and outputs that vLLM and `gym-tf eval` load.

    pip install -e ".[train]"
    gym-tf train --method gspo --lora --model ./tiny-model --dataset quickstart --reward math
"""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_tf.datasets import load_dataset
from gym_tf.errors import ConfigError
from gym_tf.rollouts import build_messages
from gym_tf.store import RunStore
from rewards import ANSWER_FREE, load_reward


class TrainConfig(BaseModel):
    """Everything a gradient run depends on; recorded with its hash like an optimize run's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["grpo", "gspo"] = Field("grpo", description="grpo: token-level ratio; gspo: sequence-level ratio")
    model: str = Field(description="a local Hugging Face model directory (no download)")
    dataset: str = Field(description="training problems: a file, a `datasets` directory, or `quickstart`")
    problem_field: str | None = Field(None, description="column holding the problem")
    answer_field: str | None = Field(None, description="column holding the answer")
    limit: int | None = Field(None, ge=1, description="use only the first N problems")
    reward: str = Field("math", description="built-in reward name or module:function (the same as optimize)")
    group_size: int = Field(4, ge=2, description="completions per prompt (G)")
    prompts_per_step: int = Field(2, ge=1, description="prompts in each optimizer step")
    max_steps: int = Field(10, ge=1, description="optimizer steps")
    learning_rate: float = Field(1e-5, gt=0, description="AdamW learning rate")
    beta: float = Field(0.0, ge=0, description="KL coefficient to the frozen reference model (0: no reference)")
    num_iterations: int = Field(1, ge=1, description="policy updates per generated batch (ratios differ from 1 after the first)")
    max_completion_tokens: int = Field(128, ge=1, description="longest completion")
    temperature: float = Field(1.0, gt=0, description="sampling temperature for the rollouts")
    lora: bool = Field(False, description="train LoRA adapters instead of all weights")
    lora_rank: int = Field(16, ge=1, description="LoRA rank r")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha")
    lora_target_modules: str = Field("all-linear", description="modules to adapt: all-linear, or comma-separated names")
    rslora: bool = Field(False, description="rank-stabilized LoRA scaling (alpha / sqrt(r))")
    seed: int = Field(0, description="training seed")
    output_dir: str = Field("gym-tf-train", description="checkpoints and the final adapter or model")
    save_steps: int = Field(5, ge=1, description="checkpoint every N steps (what --resume continues from)")

    @model_validator(mode="after")
    def _rules(self) -> "TrainConfig":
        if not Path(self.model).is_dir():
            raise ValueError(f"model must be a local HF model directory; {self.model!r} is not a directory")
        return self


def trl_reward(reward: Callable[..., Any], group_size: int) -> Callable[..., list[float | None]]:
    """Adapt a gym-tf reward `(completions, **row)` to TRL's batched call, one group of G completions at a time,
    so that group rewards (majority vote) see their group."""

    def score(prompts, completions, **columns) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores: list[float | None] = []
        for start in range(0, len(texts), group_size):
            row = {k: v[start] for k, v in columns.items() if isinstance(v, list) and len(v) == len(texts)}
            result = reward(texts[start : start + group_size], **row)
            if inspect.isawaitable(result):
                raise TypeError("async rewards (the LLM judge) are not supported by the gradient trainer")
            scores.extend(None if s is None else float(s) for s in result)
        return scores

    score.__name__ = getattr(reward, "__name__", "reward")
    return score


def checkpointing_option() -> str:
    """transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name warns); earlier
    releases know only the old one. Measured on both: 5.23 here, 5.17 on the GPU machine."""
    import dataclasses

    from trl import GRPOConfig

    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def trl_args(config: TrainConfig) -> Any:
    import torch
    from trl import GRPOConfig

    gpu = torch.cuda.is_available()
    sequence = config.method == "gspo"
    return GRPOConfig(
        output_dir=config.output_dir,
        num_generations=config.group_size,
        per_device_train_batch_size=config.group_size * config.prompts_per_step,
        max_completion_length=config.max_completion_tokens,
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        beta=config.beta,
        num_iterations=config.num_iterations,
        temperature=config.temperature,
        # GSPO (Zheng et al. 2025): one importance ratio per sequence, with the paper's tight clipping range.
        importance_sampling_level="sequence" if sequence else "token",
        loss_type="grpo" if sequence else "dapo",
        epsilon=3e-4 if sequence else 0.2,
        epsilon_high=4e-4 if sequence else None,
        seed=config.seed,
        use_cpu=not gpu,
        bf16=gpu and torch.cuda.is_bf16_supported(),
        **{checkpointing_option(): gpu},
        logging_steps=1,
        save_steps=config.save_steps,
        save_strategy="steps",
        report_to="none",
        disable_tqdm=True,
    )


def lora_config(config: TrainConfig) -> Any:
    from peft import LoraConfig

    targets = config.lora_target_modules
    return LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, use_rslora=config.rslora, task_type="CAUSAL_LM",
                      target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",")])


def resume_train_config(store: RunStore, run_id: str, max_steps: int | None = None) -> tuple[str, TrainConfig]:
    """The stored config of a train run, to continue it with `train(config, store, run_id)`; `max_steps` may be
    raised to train on past the run's original end."""
    return store.run_config(run_id, "train", TrainConfig, max_steps=max_steps)


def train(config: TrainConfig, store: RunStore, run_id: str | None = None,
          on_log: Callable[[dict], None] | None = None) -> tuple[str, Path]:
    """Train, logging every step to the run store. Returns (run id, directory of the adapter or full model).

    With `run_id` (see `resume_train_config`) it continues that run, in the same run row, from the last checkpoint
    in its output directory. A run with no checkpoint there, or whose dataset changed, is refused: never started
    over in silence.
    """
    import datasets
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    problems = load_dataset(config.dataset, config.problem_field, config.answer_field,
                            require_answer=config.reward not in ANSWER_FREE, limit=config.limit)
    rows = [{**{k: v for k, v in p.row.items() if isinstance(v, (str, int, float))},
             "prompt": build_messages(p)[0], "answer": p.answer} for p in problems]
    data = datasets.Dataset.from_list(rows)
    reward = trl_reward(load_reward(config.reward), config.group_size)
    if run_id is None:
        run_id = store.new_run("train", config.model_dump(mode="json"), Path(config.model).name, config.dataset, "")
        store.check_dataset(run_id, problems)  # recorded, for a later resume to compare
        checkpoint = None
    else:
        run_id = store.run(run_id)["id"]
        checkpoint = _last_checkpoint(config.output_dir)
        if checkpoint is None:
            raise ConfigError(f"run {run_id} has no checkpoint in {config.output_dir} to resume from (one is written "
                              f"every {config.save_steps} steps): start a new run instead")
        store.check_dataset(run_id, problems)
        store.claim_run(run_id)  # refused while another process trains it

    class RecordSteps(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                stats = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
                store.db["steps"].insert({"run_id": run_id, "step": state.global_step, "epoch": int(state.epoch or 0),
                                          "batch": state.global_step, "version_before": "", "version_after": "",
                                          "status": "trained", "tokens": "{}", "stats": json.dumps(stats),
                                          "committed": time.time()}, replace=True)
                if on_log:
                    on_log({"step": state.global_step, "max_steps": state.max_steps, **stats})

    try:
        trainer = GRPOTrainer(model=config.model, reward_funcs=[reward], args=trl_args(config), train_dataset=data,
                              peft_config=lora_config(config) if config.lora else None, callbacks=[RecordSteps()])
        trainer.remove_callback(PrinterCallback)  # progress is ours (on_log); no raw dicts on stdout
        trainer.train(resume_from_checkpoint=checkpoint)
        out = Path(config.output_dir) / ("adapter" if config.lora else "model")
        trainer.save_model(str(out))
        trainer.processing_class.save_pretrained(str(out))
    except BaseException as exc:  # recorded, then raised on: the run can be resumed from its last checkpoint
        store.finish_run(run_id, "failed", {"error": f"{type(exc).__name__}: {exc}"})
        raise
    store.finish_run(run_id, "finished", {"steps": trainer.state.global_step, "output": str(out)})
    return run_id, out


def merge_adapter(adapter_dir: str | Path, target: str | Path) -> Path:
    """Fold a LoRA adapter into its base model and save a full model directory (for servers without LoRA)."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoPeftModelForCausalLM.from_pretrained(str(adapter_dir)).merge_and_unload()
    model.save_pretrained(str(target))
    AutoTokenizer.from_pretrained(str(adapter_dir)).save_pretrained(str(target))
    return Path(target)


def _last_checkpoint(output_dir: str) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
