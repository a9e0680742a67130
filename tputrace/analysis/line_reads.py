"""Reads whose line says what they are, from the run's copy of the file: a checkpoint saved with `torch.save`, an
action given to an environment's step, a `F.one_hot` sized by the largest label, a stopping check that breaks out of
the loop, a check of finiteness that stops the run (`if not torch.isfinite(loss): raise ...`), and a check that skips
the step (`if not torch.isfinite(norm): continue`). Each is what the read is and the
change that fits it, in place of the advice for a logged loss."""

from __future__ import annotations

import linecache
import re

from tputrace.analysis.context import AnalysisContext

# A checkpoint written from the chip's tensors: each tensor is copied to the host, one wait each.
_SAVES = re.compile(r"\b(?:torch\.save|save_file|save_pretrained|save_checkpoint|save_model|save_state)\s*\(")
CHECKPOINT_READ = (
    "a checkpoint being saved (`torch.save` copies every weight and optimizer state to the host, one wait each)",
    "Saving is the checkpoint's own cost, and the copies must happen: save as rarely as the run can afford to lose "
    "(once per epoch, every few thousand steps, at the end), not every few steps; each save waits for the chip to "
    "finish the work queued before it.",
)
# `F.one_hot(labels)` with no number of classes reads the largest label to size its output.
_ONE_HOT_SIZED_BY_DATA = re.compile(r"\bone_hot\(\s*[^,()]+(?:\([^()]*\))?\s*\)")
ONE_HOT_READ = (
    "`F.one_hot` reading the largest label (`labels.max().item()`) to size its output, as no `num_classes` is given",
    "Pass the number of classes, `F.one_hot(labels, num_classes=C)`: nothing is read, and the output keeps one shape "
    "whatever labels a batch holds (a batch without the largest class would otherwise make a narrower tensor, and a "
    "new program).",
)
# A value read to act in an environment on the host (`env.step(action.item())`, `envs.step(actions.cpu().numpy())`).
ENVIRONMENT_STEP = re.compile(r"\b\w*env\w*\.step\(", re.IGNORECASE)
ENVIRONMENT_READ = (
    "the action an environment on the host needs for its next step",
    "The environment steps on the host and needs each action, so the read stays, once per environment step: make it "
    "the only wait of the step (sample and read the action first, queue the update after it), act in many "
    "environments per read (a vectorized environment, `gymnasium.vector`), so one wait serves them all, or collect "
    "a rollout of several steps and update once per rollout.",
)
# `if loss.item() < tol:` followed by `break`: a check of whether to stop.
_CHECK = re.compile(r"^(?:if|elif|while)\b.*(?:\.item\(\)|float\(|bool\()")
_CONDITION = re.compile(r"^(?:if|elif|while)\b")
_STOPS = re.compile(r"^(?:break|return\b|raise\b|sys\.exit\(|exit\()")
STOPPING_READ = (
    "the line's check of whether to stop the loop",
    "Check the condition every N steps (`if step % 100 == 0 and loss.item() < tol: break`): the few steps run past "
    "the stop cost less than a wait for the chip in every step.",
)
# The same check made several times in each step that makes it: it stops an inner loop (a greedy decode's
# `if (token == eos).all(): break` in a validation), not the training loop.
INNER_STOPPING_READ = (
    "the line's check of whether to stop an inner loop (a decoding loop's `if (token == eos).all(): break`), made at "
    "each of that loop's iterations, so the host waits for the chip at every one of them",
    "Run the inner loop a fixed number of iterations and read nothing in it: keep a `done` mask on the chip "
    "(`done |= token == eos`) and mask what finished rows produce (`token = torch.where(done, pad_id, token)`), so the "
    "host queues all the iterations without a wait; or check the condition every few iterations "
    "(`if i % 8 == 7 and done.all(): break`), where the iterations run past the stop cost less than a wait at each.",
)
# `if not torch.isfinite(norm): continue`: the step is skipped on the host's reading of a chip value.
_SKIPS = re.compile(r"^continue\b")
_NON_FINITE = re.compile(r"\bis(?:finite|nan|inf|posinf|neginf)\b")
NON_FINITE_SKIP_READ = (
    "the line's check of whether the step's values are finite, to skip the update (`continue`): each step waits for "
    "the chip to finish its backward before the host can decide",
    "Keep the skip on the chip, as GradScaler does: step every time, with `ok = torch.isfinite(norm)` computed on the "
    "chip and the gradients zeroed where it is False (`p.grad = torch.where(ok, p.grad, 0.0)` for each parameter, or "
    "`torch.nan_to_num_` when only the non-finite entries should go); an optimizer with momentum or weight decay "
    "still moves on a zeroed step, so also scale its learning rate by `ok` (a tensor `lr`). Count the skips on the "
    "chip (`skipped += ~ok`) and read the count every N steps or after the loop.",
)
# `if not torch.isfinite(loss): raise ...`: a guard against divergence, read every step.
NON_FINITE_STOP_READ = (
    "the line's check of whether the step's values are finite, to stop the run (`raise`, `break`): each step waits for "
    "the chip to finish the value before the host can decide",
    "Check finiteness every N steps, not every step: keep a flag on the chip (`nonfinite = torch.zeros((), "
    "dtype=torch.bool, device=...)` before the loop, `nonfinite |= ~torch.isfinite(loss)` each step) and read it "
    "every N steps (`if step % 100 == 0 and nonfinite.item(): raise ...`); a diverged run then stops at most N steps "
    "late, which costs less than a wait for the chip in every step. (`torch._assert_async`, CUDA's check without a "
    "read, checks nothing on a TPU: XLA has no asynchronous assert.)",
)
SKIP_READ = (
    "the line's check of whether to skip the step (`continue`): each step waits for the chip before the host can "
    "decide",
    "Make the skip a mask on the chip instead of a branch on the host: run the step every time with its loss (or "
    "gradients) multiplied by the condition (`loss = loss * keep` with `keep` a chip tensor), so a skipped step "
    "changes nothing (with momentum or weight decay, scale the learning rate by it too); or check the condition every "
    "N steps.",
)


def line_read(context: AnalysisContext, frame_id: int | None, kind: str) -> tuple[str, str] | None:
    """What the read at `frame_id`'s line is and how to change it, when its text says; None otherwise."""
    location = context.location(frame_id)
    copy = None if location is None else context.trace.source_copy(location.file)
    if location is None or copy is None:
        return None
    text = _code(linecache.getline(copy, location.line))
    if _SAVES.search(text) and kind in ("cpu", "numpy", "tolist", "item"):
        return CHECKPOINT_READ
    if ENVIRONMENT_STEP.search(text) and kind in ("item", "tolist", "numpy", "cpu"):
        return ENVIRONMENT_READ
    if _ONE_HOT_SIZED_BY_DATA.search(text) and kind == "item":
        return ONE_HOT_READ
    checks = _CHECK.match(text) if kind == "item" else kind == "bool" and _CONDITION.match(text)
    following = _next_statement(copy, location.line) if checks else ""
    if checks and _NON_FINITE.search(text) and _body_stops(copy, location.line):
        return NON_FINITE_STOP_READ
    if checks and _STOPS.match(following):
        return STOPPING_READ
    if checks and _SKIPS.match(following):
        return NON_FINITE_SKIP_READ if _NON_FINITE.search(text) else SKIP_READ
    return None


def environment_steps(context: AnalysisContext) -> dict[int, str]:
    """The loop's number of reads at each line that steps an environment on the host (`env.step(action.item())`), by
    that count: the number of environment steps the loop took, and the line."""
    where, params = context.loop_where("s")
    counts: dict[int, str] = {}
    for frame_id, count in context.trace.sql(
            f"SELECT s.frame_id, COUNT(*) FROM syncs s WHERE {where} AND s.kind IN ('item', 'tolist', 'numpy', 'cpu') "
            "GROUP BY s.frame_id", params):
        location = context.location(frame_id)
        copy = None if location is None else context.trace.source_copy(location.file)
        if location is not None and copy is not None and ENVIRONMENT_STEP.search(_code(linecache.getline(copy, location.line))):
            counts.setdefault(int(count), context.where(frame_id))
    return counts


def _code(line: str) -> str:
    return line.split("#", 1)[0].strip()


def _body_stops(copy: str, line: int) -> bool:
    """Whether the block under `line` (an `if`) stops the loop in one of its first statements (a message logged, then
    `raise`)."""
    raw = linecache.getline(copy, line)
    indent = len(raw) - len(raw.lstrip())
    for number in range(line + 1, line + 8):
        body = linecache.getline(copy, number)
        text = _code(body)
        if not text:
            continue
        if len(body) - len(body.lstrip()) <= indent:
            return False
        if _STOPS.match(text):
            return True
    return False


def _next_statement(copy: str, line: int) -> str:
    """The first line of code after `line` (the body of an `if`)."""
    for number in range(line + 1, line + 6):
        text = _code(linecache.getline(copy, number))
        if text:
            return text
    return ""
