"""Typed settings for `optimize` and `eval`. Every field says what it does; broken rules raise ValueError naming them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_tf.backends import BackendConfig, Sampling
from gym_tf.library import RenderPolicy


class RolloutConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(0.7, ge=0, description="sampling temperature for the frozen model's answers")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling for the answers")
    max_completion_tokens: int = Field(512, ge=1, description="longest answer, in tokens")

    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_completion_tokens)


class TrafficSource(BaseModel):
    """Where a from-traffic run's problems came from: whose traffic, which time range, how rows without feedback are
    scored. Recorded with the run, so every version it makes is known to belong to that tenant."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str = Field("default", description="the tenant whose recorded traffic and feedback are learned from")
    since: float = Field(0.0, description="first recorded request used (epoch seconds)")
    until: float = Field(description="last recorded request used (epoch seconds): the run's start")
    fallback_reward: str = Field("majority", description="reward for requests without a reference answer: one that "
                                 "needs none (majority, regex, module:function), or `judge` (sees the user's comment)")
    val_fraction: float = Field(0.0, ge=0, lt=1, description="share of feedback-labelled requests held out as the gate")


class OptimizeConfig(BaseModel):
    """Everything that decides what a run learns. Recorded, with its hash, in the run store."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str = Field(description="training problems: a file, a `datasets` directory, or `quickstart`")
    problem_field: str | None = Field(None, description="column holding the problem (default: problem/question/prompt)")
    answer_field: str | None = Field(None, description="column holding the answer (default: answer/solution/final_answer)")
    limit: int | None = Field(None, ge=1, description="use only the first N problems")
    epochs: int = Field(3, ge=1, description="passes over the training problems")
    batch_size: int = Field(8, ge=1, description="problems per step; one consolidation per step")
    group_size: int = Field(4, description="answers sampled per problem (G)")
    seed: int = Field(0, description="shuffling and sampling seed; the same seed repeats the run")
    reward: str = Field("math", description="built-in reward name or module:function")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="how answers are sampled")
    learner_temperature: float = Field(0.3, ge=0, description="temperature of the learner's calls")
    learner_max_tokens: int = Field(512, ge=1, description="longest learner reply, in tokens")
    max_ops_per_group: int = Field(2, ge=1, le=8, description="operations a group may propose")
    max_attempts: int = Field(3, ge=1, description="tries per learner reply before it is recorded as rejected")
    summarize: bool = Field(False, description="summarize each rollout before comparing (the paper's design); off "
                            "(the default, the setting the learning-effect benchmark measures): the group call reads "
                            "the raw answers, saving one call per rollout")
    hard_groups: Literal["skip", "reference"] = Field(
        "skip", description="all-fail groups: skip, or contrast the failures with the reference answer/solution"
    )
    max_library_tokens: int | None = Field(1024, ge=16, description="cap on the rendered library (estimated tokens)")
    retrieve_lessons: int | None = Field(None, ge=1, description="show each problem only its N most relevant lessons "
                                         "(BM25); none: every lesson that fits the cap")
    examples_per_prompt: int = Field(2, ge=0, description="worked examples shown per problem, the most relevant (BM25)")
    examples_as_turns: bool = Field(False, description="show worked examples as earlier turns of the chat (the "
                                    "problem as the user's message, its solution as the model's own), not as text in "
                                    "the system message; recorded in each version's render policy, so eval and serve "
                                    "show them the same way")
    worked_examples: bool = Field(True, description="add verified solutions from the model's own correct rollouts "
                                  "as worked examples")
    max_example_chars: int = Field(900, ge=100, le=1600, description="longest solution kept as a worked example, "
                                   "in characters (its problem's statement not counted; the whole item is at most 1600)")
    examples_per_answer: int | None = Field(None, ge=1, description="keep at most this many worked examples with "
                                            "the same final answer (none: no limit); a small model shown the same "
                                            "answer again and again copies it")
    refuse_copied_examples: bool = Field(False, description="keep no answer whose words are at least 80% a worked "
                                         "example's solution (a copy, right only where its answer happens to be "
                                         "this problem's) as another worked example")
    refuse_answer_in_problem: bool = Field(False, description="keep no worked example of a problem whose answer "
                                           "stands in its own statement (a palindrome to spell backward, the GCD of "
                                           "990 and 330), unless most problems are like that (Yes or No questions)")
    learner_examples: int = Field(0, ge=0, le=16, description="where none of the model's answers to a problem is fit "
                                  "to show, the learner answers it this many times and a verified answer becomes the "
                                  "worked example (0: off; meant for a stronger learner)")
    hinted_examples: int = Field(0, ge=0, le=16, description="where no answer to a problem (the model's, nor the "
                                 "learner's) is fit to show, the model answers it this many times told its reference "
                                 "answer (STaR's rationalization), and a verified answer that does not say it was told "
                                 "becomes the worked example (0: off; for a model that solves almost nothing)")
    labeled_examples: bool = Field(False, description="where no answer to a problem (the model's, the learner's, "
                                   "told or not) is fit to show, the problem and its reference answer become the "
                                   "worked example, with no working (a labeled demonstration, as DSPy's "
                                   "BootstrapFewShot fills its free slots): it shows the answer's form and length, "
                                   "for a model whose answers run long or come in the wrong form (with "
                                   "refuse_copied_examples, a label repeating another's answer counts as a copy)")
    python_tool: bool = Field(False, description="the model may write a Python program in its answer; it is run "
                              "(limited, not sandboxed: `gym_tf.python_tool`) and the model, shown what it printed, "
                              "answers again")
    val_dataset: str | None = Field(None, description="held-out problems; a step is kept only if it scores at least as well on them")
    val_samples: int = Field(4, ge=1, description="samples per validation problem")
    prune: bool = Field(False, description="after the last step, leave each item out in turn on validation (its "
                        "credit) and drop the lessons that showed no help (needs val_dataset; "
                        "on by default in the CLI and the benchmark, off here so that runs made before it resume "
                        "as they started)")
    max_tokens: int | None = Field(None, ge=1, description="token budget for the whole run (all stages); stops cleanly")
    learn_minutes: float | None = Field(None, gt=0, description="start no learning step once the run has learned "
                                        "this long (wall clock, a resumed run's earlier steps included); the prune "
                                        "step still runs, so a slow machine still ends with a measured library")
    start_library: str = Field("empty", description="library version to start from")
    backend: BackendConfig = Field(default_factory=BackendConfig, description="the frozen model answering problems")
    learner: BackendConfig | None = Field(None, description="a different model for the learning stages (default: same)")
    traffic: TrafficSource | None = Field(None, description="set when the problems are recorded traffic "
                                          "(`--from-traffic`): rewards then come from user feedback first")

    @model_validator(mode="after")
    def _rules(self) -> "OptimizeConfig":
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 to compare rollouts")
        return self

    def recorded(self) -> dict:
        """The config as stored: API keys removed."""
        data = self.model_dump(mode="json")
        data["backend"] = self.backend.recorded()
        data["learner"] = self.learner.recorded() if self.learner else None
        if self.traffic is None:
            del data["traffic"]  # dataset runs keep the config hash they had before traffic runs existed
        if not self.prune:
            del data["prune"]  # likewise for runs without the prune step
        if not self.learner_examples:
            del data["learner_examples"]  # and for runs where the learner answers no problem
        if not self.hinted_examples:
            del data["hinted_examples"]  # and for runs that never tell the model an answer
        if self.examples_per_answer is None:
            del data["examples_per_answer"]  # and for runs with no cap on examples per answer
        if not self.refuse_copied_examples:
            del data["refuse_copied_examples"]  # and for runs that keep copies
        if not self.refuse_answer_in_problem:
            del data["refuse_answer_in_problem"]  # and for runs that show examples whose answer is in the problem
        if not self.labeled_examples:
            del data["labeled_examples"]  # and for runs that show no answer without working
        if not self.examples_as_turns:
            del data["examples_as_turns"]  # and for runs that show examples as system text
        if not self.python_tool:
            del data["python_tool"]  # and for runs whose model runs no code
        if self.learn_minutes is None:
            del data["learn_minutes"]  # and for runs with no time limit
        return data

    def render_policy(self) -> RenderPolicy:
        return RenderPolicy(max_tokens=self.max_library_tokens, lessons=self.retrieve_lessons,
                            examples=self.examples_per_prompt, examples_as_turns=self.examples_as_turns)

    def learner_sampling(self) -> Sampling:
        return Sampling(temperature=self.learner_temperature, max_tokens=self.learner_max_tokens)
