"""The course, declared once: its weeks, in order, and each week's graded cells — the exercises (number, name, kind,
section, points, lib's reference) and the written answers. Pure data and a few helpers; it imports nothing of the lab
(no torch), so a shell script can ask it: `python -m grader.course_map weeks` prints the weeks' numbers.

What derives from it: `grader.course.WEEKS`, the weeks tools/gpu_check.sh runs, the week loops of the tests. What
is still written by hand beside it, and held to it by tests/test_course_map.py (which names the file and the field
that disagree): each week's folder (solutions/NN/, tools/weeks/weekNN/), the notebook's graded cells and their
points (built from its sources tools/weeks/weekNN/*.py by tools/weeks/build.py, which takes the notebook's file name
from here), the check registry (`@WEEK.exercise(number, name, section=...)` in grader/checks/weekNN.py), the pytest
file solutions/NN/test_weekNN.py, the week table of README.md and the "kind" column of each week's README.
docs/authoring-a-week.md, "Adding a week", lists them in order.

One exercise, one name: `name` is its solution cell's grade_id, its check `check_<name>`, its graded test cell
`test_<name>` (whose points `points` are), its pytest test `test_exNN_<name>`, and lib's function or class of that
name is its reference (`lib`, the answer key: a stub in the graded process). `kind` is the week README's, now
(derive, design, predict, practice, ...); `section` is the check's, the one its messages point to."""
from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    number: int
    name: str
    kind: str
    section: str
    points: int
    lib: str | None = None  # "lib.module.name": lib's function or class named like the exercise
    own_cell: bool = True  # False: no solution cell of its own (week 19's engine is built from the notebook's parts)
    # True: a kernel or cache written in torch ops, which is what its check observes: during its calls the tensors'
    # data may not leave torch for numpy or Python arithmetic (grader.host_budget)
    torch_only: bool = False

    @property
    def check(self) -> str:
        return f"check_{self.name}"

    @property
    def test_cell(self) -> str:
        return f"test_{self.name}"

    @property
    def pytest_name(self) -> str:
        return f"test_ex{self.number:02d}_{self.name}"


@dataclass(frozen=True)
class Written:
    """A written answer: a markdown cell graded by hand."""
    name: str  # its grade_id
    points: int


@dataclass(frozen=True)
class CourseWeek:
    number: int
    topic: str  # as README.md's week table gives it
    notebook: str  # the file name in solutions/NN/ and weeks/NN/
    exercises: tuple[Exercise, ...]
    written: tuple[Written, ...] = ()

    @property
    def folder(self) -> str:
        return str(self.number)

    def exercise(self, name: str) -> Exercise:
        return next(e for e in self.exercises if e.name == name)


COURSE: tuple[CourseWeek, ...] = (
    CourseWeek(16, "the KV cache from first principles; MHA / MQA / GQA",
               "week16_kv_cache.ipynb", exercises=(
        Exercise(1, "step_flops", "derive",
                 "1 (Why generation without a cache is quadratic)", 1, lib="lib.bench.roofline.step_flops"),
        Exercise(2, "causal_mask", "derive", "2 (The causal mask)", 1, lib="lib.attn.masks.causal_mask"),
        Exercise(3, "LayerKVCache", "design", "3 (The cache)", 2, lib="lib.modeling.kv_cache.LayerKVCache",
                 torch_only=True),
        Exercise(4, "gqa_attention", "design",
                 "4 (Attention with grouped KV heads)", 2, lib="lib.attn.attention.gqa_attention", torch_only=True),
        Exercise(5, "generate", "design", "5 (Generation with the cache)", 3, lib="lib.modeling.generate.generate"),
        Exercise(6, "kv_cache_bytes", "derive", "6 (How much memory)", 2, lib="lib.modeling.kv_cache.kv_cache_bytes"),
        Exercise(7, "roofline_time", "derive", "7 (How much faster, and why)", 1, lib="lib.bench.roofline.roofline_time"),
        Exercise(8, "decode_time", "predict", "7 (How much faster, and why)", 2),
        Exercise(9, "pool_kv_heads", "design", "8 (What sharing KV heads costs)", 2, lib="lib.modeling.gqa.pool_kv_heads"),
        Exercise(10, "RollingKVCache", "design", "9 (Sliding window)", 2, lib="lib.modeling.kv_cache.RollingKVCache",
                 torch_only=True),
        Exercise(11, "answer_q1", "derive", "10 (Check your understanding)", 1),
        Exercise(12, "answer_q3", "derive", "10 (Check your understanding)", 1),
    ), written=(
        Written("answer_q2", 2),
    )),
    CourseWeek(17, "FlashAttention: tiling, online softmax, IO complexity",
               "week17_flash_attention.ipynb", exercises=(
        Exercise(1, "naive_attention", "practice",
                 "1 (What standard attention costs)", 2, lib="lib.attn.attention.naive_attention", torch_only=True),
        Exercise(2, "score_bytes", "derive", "1 (What standard attention costs)", 1, lib="lib.attn.attention.score_bytes"),
        Exercise(3, "online_softmax", "derive", "2 (Online softmax)", 2, lib="lib.attn.attention.online_softmax",
                 torch_only=True),
        Exercise(4, "flash_attention_forward", "design",
                 "3 (The tiled forward pass)", 4, lib="lib.attn.attention.flash_attention_forward", torch_only=True),
        Exercise(5, "standard_io", "derive", "4 (Counting HBM traffic)", 2, lib="lib.attn.io_model.standard_io"),
        Exercise(6, "flash_io", "derive", "4 (Counting HBM traffic)", 2, lib="lib.attn.io_model.flash_io"),
        Exercise(7, "flash_attention_backward", "derive",
                 "5 (The backward pass)", 3, lib="lib.attn.attention.flash_attention_backward", torch_only=True),
        Exercise(8, "FlashAttention", "design", "5 (The backward pass)", 2, lib="lib.attn.attention.FlashAttention",
                 torch_only=True),
        Exercise(9, "merge_partials", "derive",
                 "6 (One query, many keys: split-K)", 1, lib="lib.attn.attention.merge_partials", torch_only=True),
        Exercise(10, "flash_decode", "design",
                 "6 (One query, many keys: split-K)", 2, lib="lib.attn.attention.flash_decode", torch_only=True),
        Exercise(11, "softmax_rows", "design",
                 "8 (The kernel itself: FlashAttention in Triton)", 2, lib="lib.attn.triton_attention.softmax_rows"),
        Exercise(12, "tiled_matmul", "practice",
                 "8 (The kernel itself: FlashAttention in Triton)", 2, lib="lib.attn.triton_attention.tiled_matmul"),
        Exercise(13, "flash_attention_triton", "design",
                 "8 (The kernel itself: FlashAttention in Triton)", 4,
                 lib="lib.attn.triton_attention.flash_attention_triton"),
        Exercise(14, "answer_q1", "derive", "9 (Check your understanding)", 1),
        Exercise(15, "answer_q2", "derive", "9 (Check your understanding)", 1),
        Exercise(16, "answer_q3", "derive", "9 (Check your understanding)", 1),
        Exercise(17, "predict_peak_bytes", "predict", "7 (On the real model)", 2),
    ), written=(
        Written("derive_flash_io", 2), Written("derive_delta", 2), Written("q4_written", 3),
    )),
    CourseWeek(18, "speculative decoding: draft, verify, rejection sampling",
               "week18_speculative.ipynb", exercises=(
        Exercise(1, "speculative_generate", "design",
                 "2 (Greedy speculation and rollback)", 3, lib="lib.spec_decode.speculative.speculative_generate"),
        Exercise(2, "verify", "derive", "3 (Speculative sampling)", 3, lib="lib.spec_decode.speculative.verify"),
        Exercise(3, "speculative_sample", "design", "3 (Speculative sampling)", 2),
        Exercise(4, "expected_rejections", "derive", "4 (Acceptance: theory and measurement)", 2),
        Exercise(5, "lookup_draft", "practice", "5 (Drafts compared on SmolLM2)", 2),
        Exercise(6, "best_k", "derive", "6 (The speedup model)", 2),
        Exercise(7, "expected_target_calls", "predict", "7 (A draft you train, and a prediction)", 2),
        Exercise(8, "batched_speculative_generate", "design", "8 (The ragged batch)", 3),
        Exercise(9, "tree_accept", "derive", "11 (Trees: many drafts verified in one forward)", 3,
                 lib="lib.spec_decode.tree_speculative.tree_accept"),
    ), written=(
        Written("answer_q5", 2), Written("answer_q6", 2), Written("answer_q7", 3),
    )),
    CourseWeek(19, "continuous batching and PagedAttention",
               "week19_paged_batching.ipynb", exercises=(
        Exercise(1, "continuous_gain", "predict", "1 (Static batching's waste)", 2),
        Exercise(2, "blocks_needed", "derive", "2 (Preallocation's waste)", 1, lib="lib.batching.paged.blocks_needed"),
        Exercise(3, "slots_wasted", "derive", "2 (Preallocation's waste)", 1, lib="lib.batching.paged.slots_wasted"),
        Exercise(4, "BlockAllocator", "design", "3 (The block allocator)", 2, lib="lib.batching.paged.BlockAllocator"),
        Exercise(5, "slot_mapping", "derive", "4 (Block tables and paged attention)", 1, lib="lib.batching.paged.slot_mapping"),
        Exercise(6, "paged_attention", "design",
                 "4 (Block tables and paged attention)", 3, lib="lib.batching.paged.paged_attention", torch_only=True),
        Exercise(7, "block_hashes", "design", "7 (Prefix caching)", 1, lib="lib.batching.blocks.block_hashes"),
        Exercise(8, "PrefixCache", "design", "7 (Prefix caching)", 3, lib="lib.batching.blocks.PrefixCache"),
        Exercise(9, "schedule", "design",
                 "8 (The scheduler: preemption and chunked prefill)", 3, lib="lib.batching.engine.schedule"),
        Exercise(10, "engine", "milestone",
                 "8 (The scheduler: preemption and chunked prefill; Your engine)", 2, own_cell=False),
        Exercise(11, "predict_steps", "predict",
                 "8 (The scheduler: preemption and chunked prefill; Predicting the step count)", 2),
        Exercise(12, "answer_q1", "derive", "10 (Check your understanding)", 1),
        Exercise(13, "answer_q3", "derive", "10 (Check your understanding)", 1),
    ), written=(
        Written("answer_q2", 2), Written("answer_q4", 2),
    )),
    CourseWeek(20, "quantized inference: GGUF / llama.cpp formats, GPTQ, AWQ",
               "week20_quantization.ipynb", exercises=(
        Exercise(1, "quantize_q8_0", "practice", "2 (Q8_0, Q4_0 and Q4_1, byte for byte)", 2),
        Exercise(2, "quantize_q4_1", "practice", "2 (Q8_0, Q4_0 and Q4_1, byte for byte)", 2),
        Exercise(3, "quantize_q5_0", "practice", "2 (Q8_0, Q4_0 and Q4_1, byte for byte)", 2),
        Exercise(4, "predict_rmse", "predict", "2 (Q8_0, Q4_0 and Q4_1, byte for byte)", 2),
        Exercise(5, "dequantize_q4_k", "practice + a predict step", "4 (K-quants)", 2),
        Exercise(6, "quantize_q4_k", "design", "4 (K-quants)", 2),
        Exercise(7, "column_importance", "derive", "5 (Perplexity versus bits per weight)", 1),
        Exercise(8, "allocate_bits", "design", "6 (Per-layer sensitivity)", 1, lib="lib.quantization.quant.allocate_bits"),
        Exercise(9, "gptq_quantize", "derive", "7 (GPTQ)", 3, lib="lib.quantization.gptq.gptq_quantize"),
        Exercise(10, "awq_quantize", "design", "8 (AWQ)", 2, lib="lib.quantization.awq.awq_quantize"),
        Exercise(11, "gguf_bytes", "design", "11 (A GGUF file of your own)", 2),
        Exercise(12, "answer_q9", "derive from a measurement", "12 (Check your understanding)", 1),
    ), written=(
        Written("column_importance_why", 1), Written("answer_q6", 2), Written("answer_q7", 1),
        Written("answer_q8", 1), Written("answer_q9_why", 1),
    )),
    CourseWeek(21, "capstone — serve it: an OpenAI-compatible server on the engine, load-tested with the "
                   "`openai` client",
               "week21_serving.ipynb", exercises=(
        Exercise(1, "TextStream", "design", "2 (Text that never changes)", 3, lib="lib.serve.serving.TextStream"),
        Exercise(2, "ServingLoop", "design", "3 (The loop between two steps)", 4, lib="lib.serve.serving.ServingLoop"),
        Exercise(3, "predict_ttft", "predict", "5 (Predicting TTFT under load)", 3),
        Exercise(4, "e2e_latency", "derive", "6 (End to end, and what a token costs)", 1),
        Exercise(5, "cost_per_million_tokens", "derive", "6 (End to end, and what a token costs)", 1),
    ), written=(
        Written("answer_scenario_a", 2), Written("answer_scenario_b", 2), Written("answer_scenario_c", 2),
        Written("answer_scenario_d", 2),
    )),
)


def week(number: int | str) -> CourseWeek:
    """The week numbered `number` (16 or "16"); KeyError if the course has none."""
    for w in COURSE:
        if w.number == int(number):
            return w
    raise KeyError(f"the course has no week {number}: its weeks are {' '.join(week_folders())}")


def week_numbers() -> tuple[int, ...]:
    return tuple(w.number for w in COURSE)


def week_folders() -> tuple[str, ...]:
    """The weeks as their folders are named: ("16", "17", ...)."""
    return tuple(w.folder for w in COURSE)


def main(argv: list[str]) -> int:
    if argv == ["weeks"]:
        print(" ".join(week_folders()))
        return 0
    print("usage: python -m grader.course_map weeks    (prints the course's weeks: 16 17 ...)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
