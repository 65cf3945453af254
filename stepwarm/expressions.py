"""Safe integer arithmetic over runner facts, for scenario sizes.

A size in a scenario file is an int or a string such as
``"decode_query_len + 1"``, ``"max_num_batched_tokens // 2"`` or
``"block_size(0) * 2"``. :func:`evaluate` parses the string with
:func:`ast.parse` and walks the tree with a whitelist: int literals, the
names in ``facts``, ``+ - * // %``, unary ``-``/``+``, parentheses and the
calls ``block_size(i)``, ``min(a, b, ...)``, ``max(a, b, ...)`` and the
runner's KV cache functions (``kv_seqs(tokens)``, ``kv_tokens(requests)``,
see :func:`functions_of`). Nothing is evaluated by Python itself (no
``eval``, no attribute access, no imports). :func:`evaluate_condition`
evaluates one comparison (a scenario's ``requires``). :func:`buckets`
expands a limit into Triton's integer specialization classes.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Mapping

from stepwarm.profile import RunnerProfile

#: Functions an expression may call, besides ``block_size``.
_FUNCS: dict[str, Callable[..., int]] = {"min": min, "max": max}

_BINOPS: dict[type, str] = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%",
}

_CMPOPS: dict[type, tuple[str, Callable[[int, int], bool]]] = {
    ast.Lt: ("<", lambda a, b: a < b), ast.LtE: ("<=", lambda a, b: a <= b),
    ast.Gt: (">", lambda a, b: a > b), ast.GtE: (">=", lambda a, b: a >= b),
    ast.Eq: ("==", lambda a, b: a == b), ast.NotEq: ("!=", lambda a, b: a != b),
}

#: What an expression may contain, for error messages.
ALLOWED = ("integers, the facts {facts}, block_size(i), kv_seqs(tokens), "
           "kv_tokens(requests), min(...), max(...), + - * // % and parentheses")

#: Functions of the runner's KV cache an expression may call (see functions_of).
KV_FUNCS = ("kv_seqs", "kv_tokens")

#: Longest expression text accepted (characters).
MAX_LEN = 200


class ExpressionError(ValueError):
    """An expression that cannot be evaluated; the message says why and what
    is allowed (the scenario loader adds file, line, step and field)."""


def facts_of(profile: RunnerProfile) -> dict[str, int]:
    """The named facts an expression can use, read off ``profile`` (tokens
    unless the name says otherwise).

    ``lcm_block_size`` is the least common multiple of the block sizes of
    the groups that cache tokens (every group but cross-attention): the
    granularity of a prefix-cache hit on a hybrid model.

    ``prefill_chunk_align`` is what a prefill chunk that does not finish the
    prefill must end on a multiple of: on a runner with a Mamba group in
    ``align`` cache mode, that group's ``block_size`` (vLLM's
    ``Scheduler._mamba_block_aligned_split``), unless it exceeds
    ``max_num_batched_tokens`` (then sub-block chunks are scheduled); else 1.
    With several such groups, the least common multiple of their block sizes
    that fit the budget.
    """
    from math import lcm

    token_groups = [g.block_size for g in profile.kv_cache_groups
                    if g.kind != "cross_attention"] or [1]
    align_groups = [g.block_size for g in profile.kv_cache_groups
                    if g.kind == "mamba" and g.mamba_cache_mode == "align"
                    and g.block_size <= profile.max_num_batched_tokens] or [1]
    return {
        "decode_query_len": profile.decode_query_len,
        "num_spec_steps": profile.num_speculative_steps,
        "max_num_seqs": profile.max_num_seqs,
        "max_num_batched_tokens": profile.max_num_batched_tokens,
        "draft_slots": profile.draft_slots,
        # the most tokens one request can be scheduled in a step (vLLM's
        # scheduler keeps its draft slots out of the budget)
        "request_budget": profile.max_num_batched_tokens - profile.draft_slots,
        "max_model_len": profile.max_model_len,
        "max_encoder_len": profile.max_encoder_len,
        "num_blocks": profile.num_blocks,
        "num_kv_groups": len(profile.kv_cache_groups),
        # the most logprobs / prompt_logprobs a request may ask for
        "max_logprobs": profile.max_logprobs,
        "lcm_block_size": lcm(*token_groups),
        # non-final prefill chunks end on a multiple of this (Mamba align mode)
        "prefill_chunk_align": lcm(*align_groups),
        # multimodal models: the processor's image-size classes
        "num_image_classes": len(profile.image_classes),
        "max_images_per_prompt": profile.max_images_per_prompt,
        "encoder_budget": profile.encoder_budget,
        "max_image_tokens": max((c.tokens for c in profile.image_classes), default=0),
        "max_image_prompt_tokens": max((c.prompt_tokens for c in profile.image_classes),
                                       default=0),
        # the most requests one uniform decode step can hold (each also
        # keeps its draft slots out of the budget)
        "max_decode_seqs": max(1, min(profile.max_num_seqs, profile.max_num_batched_tokens
                                      // (profile.decode_query_len + profile.draft_slots))),
    }


#: The names :func:`facts_of` gives (any runner): what :func:`check_names`
#: accepts before a runner is known.
FACT_NAMES = (
    "decode_query_len", "num_spec_steps", "max_num_seqs", "max_num_batched_tokens",
    "max_model_len", "max_encoder_len", "num_blocks", "num_kv_groups", "max_logprobs",
    "lcm_block_size", "prefill_chunk_align", "num_image_classes", "max_images_per_prompt",
    "encoder_budget", "max_image_tokens", "max_image_prompt_tokens", "max_decode_seqs",
    "draft_slots", "request_budget",
)


def check_names(expr: str) -> None:
    """What can be checked of a size expression before any runner is known
    (the scenario file's format check): it parses, is no comparison, and uses
    only integers, :data:`FACT_NAMES`, the allowed calls and operators. Values
    (a division by zero, a group index, a range) are the runner's to check
    (:func:`evaluate`).

    Raises:
        ExpressionError: as :func:`evaluate` says it, for those causes.
    """
    facts = dict.fromkeys(FACT_NAMES, 1)
    text, tree = _size_tree(expr, facts)
    _Eval(text, facts, (), values=False).visit(tree.body)


def functions_of(profile: RunnerProfile) -> dict[str, Callable[[int], int]]:
    """The KV cache functions an expression can call, read off ``profile``.

    ``kv_seqs(t)``: how many requests of ``t`` tokens each (computed +
    scheduled) the KV cache holds at once: ``(num_blocks - 1) //`` the blocks
    one such request holds over all groups (lookahead and encoder input
    included, as :class:`~stepwarm.blocks.BlockLedger` counts them).
    ``kv_tokens(n)``: the most tokens (at most ``max_model_len``) each of
    ``n`` requests can have with all ``n`` holding blocks at once (0: not
    even one token each).
    """
    from stepwarm.blocks import BlockLedger

    ledger = BlockLedger.for_profile(profile)
    usable = max(0, profile.num_blocks - 1)

    def blocks_for(t: int) -> int:
        return sum(ledger.required(max(1, t)))

    def kv_seqs(t: int) -> int:
        if t < 1:
            raise ExpressionError(f"kv_seqs({t}): tokens must be >= 1")
        per = blocks_for(t)
        return usable // per if per else 1 << 30

    def kv_tokens(n: int) -> int:
        if n < 1:
            raise ExpressionError(f"kv_tokens({n}): requests must be >= 1")
        lo, hi = 0, profile.max_model_len  # largest t with n * blocks_for(t) <= usable
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if n * blocks_for(mid) <= usable:
                lo = mid
            else:
                hi = mid - 1
        return lo

    return {"kv_seqs": kv_seqs, "kv_tokens": kv_tokens}


def block_sizes_of(profile: RunnerProfile) -> tuple[int, ...]:
    """``block_size`` of each KV cache group, in group order (tokens)."""
    return tuple(g.block_size for g in profile.kv_cache_groups)


def evaluate(
    expr: int | str,
    facts: Mapping[str, int],
    block_sizes: tuple[int, ...] = (),
    functions: Mapping[str, Callable[[int], int]] | None = None,
) -> int:
    """Evaluate a size: an int as is, a string as safe integer arithmetic.

    Args:
        expr: an int or an expression string.
        facts: name -> value (see :func:`facts_of`).
        block_sizes: ``block_size(i)`` of group ``i``.
        functions: ``kv_seqs``/``kv_tokens`` (see :func:`functions_of`);
            calling one that is not given is an error.

    Returns:
        The int value.

    Raises:
        ExpressionError: syntax error, a name that is not a fact (the closest
            fact is suggested), a call other than ``block_size``/``min``/
            ``max``, ``/`` (use ``//``), division or modulo by zero, a group
            index out of range, or a value that is not an int.
    """
    if isinstance(expr, bool):
        raise ExpressionError(f"{expr!r} is a boolean; expected an integer or an expression")
    if isinstance(expr, int):
        return expr
    if not isinstance(expr, str):
        raise ExpressionError(f"{expr!r} is not an integer or an expression string")
    text, tree = _size_tree(expr, facts)
    return _Eval(text, facts, block_sizes, functions).visit(tree.body)


def _size_tree(expr: str, facts: Mapping[str, int]) -> tuple[str, ast.Expression]:
    """``expr`` stripped and parsed, refused when empty, too long, not an
    expression or a comparison."""
    text = expr.strip()
    if not text:
        raise ExpressionError("empty expression; allowed: " + _allowed(facts))
    if len(text) > MAX_LEN:
        raise ExpressionError(f"expression of {len(text)} characters, longer than the cap "
                              f"(MAX_LEN); allowed: at most {MAX_LEN} characters")
    tree = _parse(expr, text, facts)
    if isinstance(tree.body, ast.Compare):
        raise ExpressionError(f"{text!r}: a comparison is not a size; allowed: "
                              f"{_allowed(facts)} (comparisons only in requires)")
    return text, tree


def _parse(expr: object, text: str, facts: Mapping[str, int]) -> ast.Expression:
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ExpressionError(
            f"{expr!r} is not a valid expression ({e.msg}); allowed: {_allowed(facts)}"
        ) from None


def check_condition_names(text: str) -> None:
    """What can be checked of a ``requires`` comparison before any runner is
    known (the scenario file's format check, whatever ``needs`` says): it is a
    comparison with allowed operators over :data:`FACT_NAMES`, as
    :func:`check_names` checks a size expression.

    Raises:
        ExpressionError: as :func:`evaluate_condition` says it, for those causes.
    """
    evaluate_condition(text, dict.fromkeys(FACT_NAMES, 1), values=False)


def evaluate_condition(
    text: str,
    facts: Mapping[str, int],
    block_sizes: tuple[int, ...] = (),
    functions: Mapping[str, Callable[[int], int]] | None = None,
    *,
    values: bool = True,
) -> tuple[bool, str]:
    """Evaluate one comparison over runner facts, e.g. ``"max_num_seqs >= 2"``.

    Both sides are size expressions (see :func:`evaluate`); the operators are
    ``< <= > >= == !=``, chained as in Python (``"2 <= max_num_seqs <= 64"``).

    Returns:
        (truth, the comparison with the values filled in, e.g. ``"1 >= 2"``).

    Raises:
        ExpressionError: not a string, not a comparison, or a side that is
            not a valid expression.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"{text!r} is not a comparison string such as "
                              "\"max_num_seqs >= 2\"")
    text = text.strip()
    if len(text) > MAX_LEN:
        raise ExpressionError(f"expression of {len(text)} characters, longer than the cap "
                              f"(MAX_LEN); allowed: at most {MAX_LEN} characters")
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        node = None
        why = f" ({e.msg})"
    else:
        why = ""
    if not isinstance(node, ast.Compare):
        raise ExpressionError(
            f"{text!r} is not a comparison{why}; allowed: EXPR OP EXPR with OP one of "
            "< <= > >= == != (e.g. \"max_num_seqs >= 2\"), EXPR made of " + _allowed(facts))
    ev = _Eval(text, facts, block_sizes, functions, values=values)
    sides = [ev.visit(node.left)] + [ev.visit(c) for c in node.comparators]
    shown, ok = [str(sides[0])], True
    for op, a, b in zip(node.ops, sides, sides[1:]):
        if type(op) not in _CMPOPS:
            raise ExpressionError(f"{text!r}: operator {type(op).__name__} is not allowed; "
                                  "allowed: < <= > >= == !=")
        sym, fn = _CMPOPS[type(op)]
        ok = ok and fn(a, b)
        shown += [sym, str(b)]
    return ok, " ".join(shown)


def _allowed(facts: Mapping[str, int]) -> str:
    return ALLOWED.format(facts=", ".join(sorted(facts)))


class _Eval:
    """Whitelisted walk of a parsed expression (every node type not handled
    here is refused). ``values=False``: the names and form alone
    (:func:`check_names`): no value is judged (divisors, group indexes) and
    a call stands for 1."""

    def __init__(self, text: str, facts: Mapping[str, int], block_sizes: tuple[int, ...],
                 functions: Mapping[str, Callable[[int], int]] | None = None, *,
                 values: bool = True):
        self.text, self.facts, self.block_sizes = text, facts, block_sizes
        self.functions = functions or {}
        self.values = values

    def fail(self, why: str) -> ExpressionError:
        return ExpressionError(f"{self.text!r}: {why}")

    def visit(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                raise self.fail(f"{node.value!r} is not an integer; allowed: {_allowed(self.facts)}")
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.facts:
                return self.facts[node.id]
            close = difflib.get_close_matches(
                node.id, list(self.facts) + ["block_size", *KV_FUNCS], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise self.fail(f"unknown fact {node.id!r}{hint}; allowed facts: "
                            f"{', '.join(sorted(self.facts))}, block_size(i), "
                            "kv_seqs(tokens), kv_tokens(requests)")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.visit(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Div):
                raise self.fail("'/' is not allowed: sizes are integers, use '//'")
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise self.fail(f"operator {type(node.op).__name__} is not allowed; "
                                "allowed: + - * // %")
            a, b = self.visit(node.left), self.visit(node.right)
            if op in ("//", "%") and b == 0 and self.values:
                div = ast.unparse(node.right)
                raise self.fail(("division by zero; " if div == "0" else
                                 f"division by zero ({div} is 0 on this runner); ")
                                + "allowed: a divisor that is not 0 on this runner")
            return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0,
                    "%": a % b if b else 0}[op]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            name = node.func.id
            if name != "block_size" and name not in _FUNCS and name not in KV_FUNCS:
                raise self.fail(f"function {name!r} is not allowed; allowed: block_size, "
                                "kv_seqs, kv_tokens, min, max")
            args = [self.visit(a) for a in node.args]
            if not self.values:
                return 1
            if name in KV_FUNCS:
                if len(args) != 1:
                    raise self.fail(f"{name} takes one argument")
                if name not in self.functions:
                    raise self.fail(f"{name}() needs a runner profile here")
                try:
                    return self.functions[name](args[0])
                except ExpressionError as e:
                    raise self.fail(str(e)) from None
            if name == "block_size":
                if len(args) != 1:
                    raise self.fail("block_size takes one argument: the KV cache group index")
                i = args[0]
                if not 0 <= i < len(self.block_sizes):
                    raise self.fail(
                        f"block_size({i}): the runner has {len(self.block_sizes)} KV cache "
                        f"group(s); allowed: 0..{len(self.block_sizes) - 1}")
                return self.block_sizes[i]
            if name in _FUNCS:
                if not args:
                    raise self.fail(f"{name}() needs at least one argument")
                return _FUNCS[name](args)
            raise self.fail(f"function {name!r} is not allowed; allowed: block_size, "
                            "kv_seqs, kv_tokens, min, max")
        raise self.fail(f"{type(node).__name__} is not allowed here; allowed: "
                        f"{_allowed(self.facts)}")


def buckets(limit: int, low: int = 1) -> tuple[int, ...]:
    """Triton's specialization classes of an int argument, within ``low..limit``.

    Triton compiles a separate kernel variant for an int that is ``== 1``, one
    that is a multiple of 16, and one that is neither. This returns, sorted
    and without duplicates, those of ``1``, ``16``, ``17``, the largest
    multiple of 16 not above ``limit``, and the largest value not above
    ``limit`` that is neither (``limit`` itself, or ``limit - 1`` when
    ``limit`` is a multiple of 16) that lie in ``low..limit``.

    Examples: ``buckets(512) == (1, 16, 17, 511, 512)``,
    ``buckets(8) == (1, 8)``, ``buckets(40) == (1, 16, 17, 32, 40)``.

    Raises:
        ExpressionError: ``limit < low`` or ``low < 1``.
    """
    if low < 1 or limit < low:
        raise ExpressionError(f"buckets need 1 <= low <= limit, got low {low}, limit {limit}")
    top16 = limit // 16 * 16
    neither = limit if limit % 16 else limit - 1
    cands = {1, 16, 17, top16, neither}
    return tuple(sorted(v for v in cands if low <= v <= limit))
