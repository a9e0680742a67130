"""What to change for a line's per-step `.item()` (or `int(...)`/`float(...)`), read from the line's own text: the
value it reads is named in the fix, a read appended to a list is kept on the chip, a read added into a running total
becomes a total on the chip, a chip value turned into a Python number (a size, a count) is taken on the host, and a
token sampled or picked on the chip (`torch.multinomial(p, 1).item()`) stays there for the next iteration."""

from __future__ import annotations

import re

from tputrace.wording import plural

ITEM_READ = re.compile(r"(?<![\w.])(?P<value>[A-Za-z_][\w.]*)\.item\(\)")
APPENDS = re.compile(r"\.(?:append|extend)\(")
# `total += x.item()`, `total -= ...`, `total = total + x.item()`: the read is added into a running total.
_ACCUMULATES = re.compile(r"^\s*(?P<total>[A-Za-z_][\w.]*)\s*(?:[+-]=|=\s*(?P=total)\s*[+-])")
# `int(x.max())`, `float(loss)`: a chip value made a Python number without `.item()` in the text.
_NUMBER_CALL = re.compile(r"(?<![\w.])(?P<call>int|float)\(")
_GET_SCALE = re.compile(r"(?P<scaler>[A-Za-z_][\w.]*)\.get_scale\(\)")  # GradScaler's, a `.item()` of its scale

BEFORE_THE_STEP = (" In DeferAndFuse, add to it before `optimizer.step()`: the sum then runs in the step's program, where "
                   "after it the sum would start the next step's graph and the first step's graph would compile again.")
KEPT_READS = ("Keep the value on the chip: append `{value}.detach()` in place of `{value}.item()` and read the list "
              "once after the loop (`torch.stack(values).tolist()`), or every N steps, so the host can queue the next "
              "step while the chip works.")
KEPT_SEVERAL_READS = ("Keep the values on the chip: keep {detached} in place of {items} in what the line appends, and "
                      "read them once after the loop (`torch.stack(values).tolist()` for each), or every N steps, so the "
                      "host can queue the next step while the chip works.")
RUNNING_TOTAL = ("Keep the running total on the chip: add the value itself, with `.detach()` in place of `.item()`, so "
                 "`{total}` becomes a tensor on the chip (adding a tensor to a Python 0 makes one) that sums each step "
                 "with no wait, and read `{total}.item()` once after the loop, or every N steps, so the host can queue "
                 "the next step while the chip works.")
HOST_NUMBER = ("`{call}(...)` turns a chip value into a Python number, and the host waits for the chip to learn it "
               "each step. If the number is a size or a count the data already tells (a number of graphs, of tokens, a "
               "largest index), take it on the host before the data is copied to the chip (from the CPU tensor, or "
               "from what the data loader knows), or use a fixed bound; if it is only logged, keep it on the chip and "
               "read it every N steps.")
# A read of an index sampled or picked on the chip, made on the call's result: a decoding loop's next token
# (`torch.multinomial(p, 1).item()`, `dist.sample().tolist()`, `int(logits.argmax(-1))`).
_CALL = r"\((?:[^()]|\([^()]*\))*\)(?:\[[^\]]*\])?"
_TOKEN_READ = re.compile(rf"\b(?:multinomial|sample){_CALL}\.(?:item|tolist)\(\)|\bargmax{_CALL}\.item\(\)|"
                         rf"(?<![\w.])int\([\w.]*\b(?:multinomial|sample|argmax){_CALL}\)")
TOKEN_READS = ("The line reads each token sampled (or picked) on the chip to the host, one wait for the chip per token "
               "before the next iteration can be queued. Keep the tokens on the chip: feed the index tensor itself "
               "(`torch.multinomial(p, 1)`, without `.item()`) to the next iteration, write it into a tensor of tokens "
               "made once at full length on the chip (`tokens[:, i] = idx`, which keeps one shape where a growing "
               "`torch.cat` compiles at every length), and read all the tokens once after the loop (`tokens.tolist()`) "
               "to decode them.")


# `float(loss)`, `int(count)`: a named chip value made a Python number
_NUMBER_OF = re.compile(r"(?<![\w.])(?:float|int)\(\s*(?P<value>[A-Za-z_][\w.]*)\s*\)")


def values_read(text: str) -> tuple[int, list[str]]:
    """How many values the line's text reads (`.item()`, `float(x)`, `int(x)`), and the names of those read by name,
    in the line's order (`print(loss.item(), acc.item())`: 2, [`loss`, `acc`])."""
    named = sorted([*ITEM_READ.finditer(text), *_NUMBER_OF.finditer(text)], key=lambda match: match.start())
    return text.count(".item()") + len(_NUMBER_OF.findall(text)), list(dict.fromkeys(match["value"] for match in named))


def stacked_text(count: int, names: list[str]) -> str:
    """`torch.stack([loss, acc])` for the values a line reads, with `...` for those it reads unnamed."""
    return f"torch.stack([{', '.join(names + (['...'] if count > len(names) else []))}])"


def item_spelling(text: str) -> str:
    """How the line's text spells its `item` reads: `float(...)` (or `int(...)`, `bool(...)`) where it makes no
    `.item()` call and turns a chip value into a number, else `.item()`."""
    number = _NUMBER_CALL.search(text) or re.search(r"(?<![\w.])(?P<call>bool)\(", text)
    return f"{number['call']}(...)" if number and ".item()" not in text else ".item()"


def token_suggestion(text: str) -> str | None:
    """`TOKEN_READS` for a line whose text reads a token sampled or picked on the chip, else None."""
    return TOKEN_READS if _TOKEN_READ.search(text) else None


def item_suggestion(text: str, suggestion: str) -> str:
    """The per-step `.item()` fix for the line's text `text`, or `suggestion` (the general fix) where the text tells
    nothing more: a read appended to a list is kept on the chip and stacked after the loop, a read added into a total
    makes the total a chip tensor, another value than a loss (a gradient norm) is named in place of `loss`, and
    `int(...)`/`float(...)` of a chip value is told to take the number on the host."""
    values = list(dict.fromkeys(match["value"] for match in ITEM_READ.finditer(text)))
    reads = text.count(".item()")
    accumulated = _ACCUMULATES.match(text)
    if reads and accumulated:
        return RUNNING_TOTAL.format(total=accumulated["total"]) + BEFORE_THE_STEP
    if reads >= 2 and APPENDS.search(text) and len(values) == reads:
        return KEPT_SEVERAL_READS.format(detached=", ".join(f"`{value}.detach()`" for value in values),
                                         items=", ".join(f"`{value}.item()`" for value in values))
    scales = [match["scaler"] for match in _GET_SCALE.finditer(text)]
    if reads + len(scales) >= 2 and not APPENDS.search(text):
        listed = ", ".join(values + (["..."] if reads > len(values) else []))
        stacked = (f"stack them on the chip and read them at once (`torch.stack([{listed}]).tolist()`), every N steps or "
                   "after the loop, so the host waits once, if at all.")
        if not scales:
            return f"The line reads {reads} values one after another, each a wait for the chip: {stacked}"
        return (f"The line reads {reads + len(scales)} values one after another, each a wait for the chip: "
                f"{plural(reads, 'value')} by `.item()` and the loss scale by `{scales[0]}.get_scale()` (GradScaler "
                "reads it with `.item()`). Log the scale every N steps (it changes only after an overflow or every "
                "`growth_interval` steps); "
                + (f"for the others, {stacked}" if reads >= 2 else
                   "read the other value every N steps too, or keep it on the chip and read it after the loop."))
    number = _NUMBER_CALL.search(text)
    if not reads and number:
        return HOST_NUMBER.format(call=number["call"])
    if len(values) != 1:
        return suggestion
    (value,) = values
    if APPENDS.search(text):
        return KEPT_READS.format(value=value)
    return suggestion.replace("`loss.detach()`", f"`{value}.detach()`")
