"""tp-split computes the same tokens: the pass's split of the author's unsplit decode step, run by the
reference interpreter as N chips, against the unsplit program, over 32 greedy steps.

Greedy decoding: each step feeds the previous step's arg-max (ids from 1) back as the token at the next
position (from 1), each program keeping its own KV state across the steps. The tokens must be identical. The
logits are compared too: the head is replicated in a split program, so they are computed here from the last
hidden state x<layers> that @main returns (RMS norm, then the head table), as the head does.

Tolerance. Splitting changes no arithmetic but the order of two sums per layer: o_proj and down_proj each add
their inner products in `tp` partial sums (one per chip, each over in/tp terms), then add the partials in chip
order, where one chip adds all `in` terms at once. float32 rounding then differs by a few units in the last
place (eps 1.2e-7) of the sums' magnitudes, and this carries through the layers and, by the KV caches, into
later steps. Measured over the 32 steps, the differences are about 1e-6 of the scale (the largest magnitude):
2e-6 on logits of 3.8 for tiny-tp8, 3.4e-5 on logits of 34 for SmolLM2, and below 1e-6 of the hidden states'
scale. The test allows RTOL 1e-4 plus ATOL 1e-4 of the scale (an absolute part scaled by the magnitude, so
that near-zero entries are not held to a relative bound that reordered sums cannot meet): about 100 times what
is seen, yet small enough that a wrong split (a missing all-reduce, a share of the wrong rows) fails by orders
of magnitude. Tokens are compared exactly and need no tolerance: SmolLM2's closest step has its best two
logits 1.7e-3 apart, 50 times the largest difference seen. On one chip the split program does the unsplit
arithmetic in the same order, so tp 1 must match exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from logos_ir.author import written
from logos_ir.dialects import logos
from logos_ir.interpreter import Interpreter, KVState
from logos_ir.parser import parse_program
from logos_ir.passes.tp_split import TpSplit
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
from logos_ir.tensor_parallel import split_refusal
from logos_ir.weights import RandomWeights, WeightStore, open_model

STEPS = 32
CTX = 40
FIRST_TOKEN = 7
RTOL = 1e-4
ATOL = 1e-4  # of the largest magnitude of the compared tensor (see the module docstring)


def logits_of(x: np.ndarray, weights: WeightStore) -> np.ndarray:
    """The head's logits of a last hidden state: RMS norm by the final norm's weight, then the head table."""
    spec = weights.spec
    x = x.astype(np.float32)
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(spec.rms_eps))
    normed = normed * weights.get("model.norm.weight")
    table = weights.get("model.embed_tokens.weight" if spec.tie_embeddings else "lm_head.weight")
    return normed @ table.T


def greedy(program: logos.ProgramOp, weights: WeightStore) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Tokens, logits and last hidden states of STEPS greedy decode steps from FIRST_TOKEN at position 1."""
    interpreter = Interpreter(program, weights, KVState())
    last = f"x{weights.spec.layers}"
    token, tokens, logits, hidden = FIRST_TOKEN, [], [], []
    for position in range(1, STEPS + 1):
        next_token = interpreter.run(token=[token], position=[position])
        x = np.array(interpreter.last_values[last], dtype=np.float32)
        hidden.append(x)
        logits.append(logits_of(x, weights))
        token = int(np.asarray(next_token).reshape(-1)[0])
        assert 1 <= token <= weights.spec.vocab
        tokens.append(token)
    return tokens, np.stack(logits), np.stack(hidden)


def assert_close(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL * scale, err_msg=what)


def check_widths(spec: ModelSpec, weights: WeightStore, widths: tuple[int, ...]) -> None:
    unsplit = parse_program(written(spec, Cut.decode(CTX))[0].text)
    tokens, logits, hidden = greedy(unsplit, weights)
    top2 = np.sort(logits.reshape(STEPS, -1), axis=-1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]  # how far each step's arg-max is from a tie, for the failure message
    for tp in widths:
        assert split_refusal(spec, tp) is None
        module = ModuleOp([unsplit.clone()])
        TpSplit(tp).apply(Context(), module)
        program = module.ops.first
        assert isinstance(program, logos.ProgramOp) and program.chips.value.data == tp
        got_tokens, got_logits, got_hidden = greedy(program, weights)
        if got_tokens != tokens:
            step = next(i for i, (a, b) in enumerate(zip(got_tokens, tokens, strict=True)) if a != b)
            worst = float(np.abs(got_logits[: step + 1] - logits[: step + 1]).max())
            pytest.fail(
                f"tp {tp}: token {step + 1} is {got_tokens[step]}, not {tokens[step]} (the best two "
                f"logits were {gaps[step]:.3g} apart; the logits differed by up to {worst:.3g})"
            )
        if tp == 1:
            assert np.array_equal(got_logits, logits) and np.array_equal(got_hidden, hidden), "tp 1 is exact"
        assert_close(got_logits, logits, f"logits, tp {tp}")
        assert_close(got_hidden, hidden, f"last hidden states, tp {tp}")


@pytest.mark.parametrize("seed", [0, 1])
def test_tiny_tp8_random_weights(seed: int) -> None:
    spec = ModelSpec.preset("tiny-tp8")
    check_widths(spec, RandomWeights(spec, seed), (1, 2, 4, 8))


@pytest.mark.parametrize(("top_k", "renormalize"), [(2, True), (3, False)])
def test_a_mixture_of_8_experts_split_by_experts(top_k: int, renormalize: bool) -> None:
    """tiny-tp8's layers with a mixture of 8 experts of 36 numbers (a width no split but 1 and 2 divides: each
    expert is whole on its chip) over 1, 2, 4 and 8 chips, 4 to 1 experts a chip, in place of the down
    projection's partial sums the mixture's: at 2 experts a token they add up bit for bit to the unsplit sum
    (test_experts.py's kernel test), at 3 a token's outputs on different chips are grouped by chip before they
    are added; the attention's sums are reordered as above, within the same tolerance."""
    from dataclasses import replace

    spec = replace(
        ModelSpec.preset("tiny-tp8"), experts=8, experts_per_token=top_k, renormalize=renormalize, intermediate=36
    )
    check_widths(spec, RandomWeights(spec, top_k), (1, 2, 4, 8))


def test_embedded_smollm2() -> None:
    """The embedded SmolLM2-135M-Instruct (9 heads, 3 KV heads: it splits over 1 and 3 chips)."""
    with open_model("embedded") as weights:
        assert weights.spec == ModelSpec.preset("smollm2-135m")
        check_widths(weights.spec, weights, (1, 3))
