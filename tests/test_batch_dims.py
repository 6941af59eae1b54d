"""How the batch dim moves through ops (rules/_batch.py), on a hand-written module (not compiler output)."""

from __future__ import annotations

import random

from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.hlo import parse_module
from hlo_doctor.rules._batch import _Propagation
from hlo_doctor.semantics.batch_dims import BatchAnalysis
from hlo_doctor.semantics.batch_propagation import PairBits, PairValues

# Hand-written HLO: x[8,4,6] is the batch input (dim 0); w is a weight.
TEXT = """
HloModule batch_dims

body {
  p = (s32[], f32[8,24]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  h = f32[8,24] get-tuple-element(p), index=1
  n = f32[8,24] negate(h)
  ROOT t = (s32[], f32[8,24]) tuple(i, n)
}

cond {
  p = (s32[], f32[8,24]) parameter(0)
  ROOT c = pred[] constant(true)
}

ENTRY main {
  x = f32[8,4,6] parameter(0)
  w = f32[24,5] parameter(1)
  flat = f32[8,24] reshape(x)
  merged = f32[192] reshape(flat)
  split = f32[2,4,24] reshape(flat)
  cut = f32[2,4,24] reshape(flat)
  moved = f32[2,4,24] all-to-all(cut), dimensions={0}, replica_groups={{0,1}}
  tr = f32[24,8] transpose(flat), dimensions={1,0}
  bc = f32[3,24,8] broadcast(tr), dimensions={1,2}
  summed = f32[24] reduce(tr, c0), dimensions={1}, to_apply=add
  c0 = f32[] constant(0)
  phys = f32[8,24]{0,1} copy(flat)
  cast = f32[24,8]{1,0} bitcast(phys)
  y = f32[8,5] dot(flat, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  yt = f32[5,8] dot(w, flat), lhs_contracting_dims={0}, rhs_contracting_dims={1}
  zero = s32[] constant(0)
  init = (s32[], f32[8,24]) tuple(zero, flat)
  loop = (s32[], f32[8,24]) while(init), condition=cond, body=body
  out = f32[8,24] get-tuple-element(loop), index=1
  ROOT r = (f32[8,5], f32[5,8], f32[192], f32[2,4,24], f32[3,24,8], f32[24], f32[24,8], f32[8,24], f32[2,4,24]) tuple(y, yt, merged, split, bc, summed, cast, out, moved)
}

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def _batch_of_x(text: str) -> tuple[PairValues, dict[str, int]]:
    """The pairs of every value of hand-written HLO ``text`` from dim 0 of its input ``x`` (parameter
    0), followed through every op, and the node id of each name of its entry ``main``."""
    graph = build_graph(parse_module(text))
    entry = graph.computation_ids("main")
    values, _ = _Propagation(graph).run({entry["x"]: frozenset({(0, 0)})}, through_dots=True)
    return values, entry


def test_batch_dim_through_each_kind_of_op():
    module = parse_module(TEXT)
    graph = build_graph(module)
    entry = graph.computation_ids("main")
    values, _ = _Propagation(graph).run({entry["x"]: frozenset({(0, 0)})}, through_dots=True)

    def dims(name: str, computation: str = "main") -> set[int]:
        return {d for _, d in values[graph.computation_ids(computation)[name]]}

    assert dims("flat") == {0}          # [8,4,6] -> [8,24]: dim 0 kept
    assert dims("merged") == {0}        # merged into one dim that holds the batch
    assert dims("split") == {0}         # 8 -> 2*4, the program's own reshape: into its major piece (2)
    assert dims("cut") == {1}           # the same split feeding an all-to-all: into its largest piece (4)
    assert dims("tr") == {1}            # transpose by the permutation
    assert dims("bc") == {2}            # broadcast by dimensions={1,2}
    assert dims("summed") == set()      # reduced away
    assert dims("cast") == {1}          # bitcast of layout {0,1}: physically [24,8], batch minor
    assert dims("y") == {0} and dims("yt") == {1}   # a free dim of either operand
    assert dims("h", "body") == {0} and dims("n", "body") == {0}   # into the loop
    assert dims("out") == {0}           # and out of it
    assert dims("w") == set()


def _random_pairs(rng: random.Random, numbers: list[int]) -> frozenset[tuple[int, int]]:
    return frozenset((rng.choice(numbers), rng.randrange(5)) for _ in range(rng.randrange(12)))


def test_pair_bits_are_the_sets_of_pairs():
    """The propagation's bits mean what the sets of pairs meant: coded, moved, kept and read back."""
    rng = random.Random(7)
    numbers = [3, 9, 10, 41, 200]
    coding = PairBits(numbers)
    for _ in range(300):
        pairs = _random_pairs(rng, numbers)
        bits = coding.encode(pairs)
        assert coding.pairs(bits) == pairs
        mapping = tuple(rng.randrange(-1, 5) for _ in range(rng.randrange(6)))
        moved = {(p, mapping[d]) for p, d in pairs if d < len(mapping) and mapping[d] >= 0}
        assert coding.pairs(coding.move(mapping, bits)) == moved
        rank = rng.randrange(6)
        assert coding.pairs(coding.keep(bits, rank)) == {(p, d) for p, d in pairs if d < rank}
    assert coding.decode((coding.encode({(9, 1)}), 0)) == (frozenset({(9, 1)}), frozenset())


def test_batch_dims_are_those_of_the_sorted_pairs():
    """dim -> batch input, in the order (and with the input, the largest) the sorted pairs gave."""
    module = parse_module(TEXT)
    graph = build_graph(module)
    key = ("main", "flat")
    node = graph.id_of(key)
    rng = random.Random(11)
    numbers = [2, 5, 6, 30, 31]
    coding = PairBits(numbers)
    for _ in range(200):
        pairs = _random_pairs(rng, numbers)
        inputs = frozenset(n for n in numbers if rng.random() < 0.6)
        bits = [0] * (len(graph) + 1)
        bits[node] = coding.encode(pairs)
        analysis = BatchAnalysis(module, graph, inputs, frozenset(), {}, PairValues(bits, coding), {})
        expected = {dim: param for param, dim in sorted(pairs) if param in inputs}
        assert list(analysis.batch_dims(key).items()) == list(expected.items())


# Hand-written HLO (not compiler output): an eval step whose second layer is applied as ``w @ x.T``,
# so the weight w1 reaches its dot as the lhs's free dim 0, as the data x does in the first layer.
EVAL_W_XT = """
HloModule eval_w_xt

ENTRY main {
  x = f32[8,16] parameter(0)
  w0 = f32[16,32] parameter(1)
  w1 = f32[64,32] parameter(2)
  w2 = f32[16,64] parameter(3)
  h = f32[8,32] dot(x, w0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ht = f32[32,8] transpose(h), dimensions={1,0}
  g = f32[64,8] dot(w1, ht), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT o = f32[16,8] dot(w2, g), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_a_weight_applied_as_w_at_x_transposed_has_its_dim_0_contracted_by_the_next_layer():
    from hlo_doctor.semantics.batch_dims import contracted_inputs

    module = parse_module(EVAL_W_XT)
    graph = build_graph(module)
    # x's batch dim goes through every layer; w0's dim 0 is a contracting dim of its own dot, and w1's
    # output features (its dim 0) are contracted by the next layer's dot. The last layer's w2 keeps its
    # dim 0 to the output: this test alone cannot tell it from data.
    assert contracted_inputs(module, graph, frozenset({0, 1, 2, 3})) == {1, 2}
    assert contracted_inputs(module, graph, frozenset({0})) == frozenset()


# Hand-written HLO (not compiler output): a projection's bias b (8 = 2 heads x 4) is added to the
# projection of x, the heads are split off and folded in with the batch ([B, H] -> [B * H], batch
# major) for the attention dot; t's dim 0 reaches a fold as its minor piece (transposed first, as
# the partitioner's all-to-all reshards do).
HEAD_FOLD = """
HloModule head_fold

ENTRY main {
  x = f32[2,8] parameter(0)
  w = f32[8,8] parameter(1)
  b = f32[8] parameter(2)
  k = f32[4,4,3] parameter(3)
  t = f32[2,4] parameter(4)
  y = f32[2,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  bb = f32[2,8] broadcast(b), dimensions={1}
  q = f32[2,8] add(y, bb)
  heads = f32[2,2,4] reshape(q)
  folded = f32[4,4] reshape(heads)
  xs = f32[2,2,4] reshape(x)
  xfolded = f32[4,4] reshape(xs)
  tt = f32[4,2] transpose(t), dimensions={1,0}
  tfolded = f32[8] reshape(tt)
  tr = f32[4,2] reshape(tfolded)
  both = f32[4,4] add(folded, xfolded)
  s0 = f32[4,3] dot(both, k), lhs_batch_dims={0}, lhs_contracting_dims={1}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT s = (f32[4,3], f32[4,2]) tuple(s0, tr)
}
"""


def test_up_to_the_first_dots_a_bias_broadcast_along_the_rows_carries_no_batch():
    module = parse_module(HEAD_FOLD)
    graph = build_graph(module)
    entry = graph.computation_ids("main")
    seeds = {entry["x"]: frozenset({(0, 0)}), entry["b"]: frozenset({(2, 0)}), entry["t"]: frozenset({(4, 0)})}
    first, _ = _Propagation(graph).run(seeds, through_dots=False)
    assert first[entry["bb"]] == frozenset()        # a vector broadcast along the rows: per feature
    assert first[entry["xfolded"]] == {(0, 0)}      # x's dim 0 is the fold's major piece
    assert first[entry["folded"]] == frozenset()    # so the heads folded in with the batch carry none
    assert first[entry["tfolded"]] == {(4, 0)}      # a fold keeps its minor piece's pairs (a reshard's fold)
    # Followed through everything (the dots too), a bias's dim goes on and a fold keeps every piece's pairs.
    every, _ = _Propagation(graph).run(seeds, through_dots=True)
    assert every[entry["folded"]] == {(0, 0), (2, 0)}
    assert every[entry["tfolded"]] == {(4, 0)}


# Hand-written HLO (not compiler output), in the form torch_xla lowers ``F.layer_norm`` to: the tokens
# folded into [1, B * S, D] (the batch and the sequence merged, a unit dim in front), then a batch norm
# whose feature dim (1) is the tokens.
LAYER_NORM_AS_BATCH_NORM = """
HloModule layer_norm_as_batch_norm

ENTRY main {
  x = f32[4,8,16] parameter(0)
  one = f32[32] parameter(1)
  zero = f32[32] parameter(2)
  folded = f32[1,32,16] reshape(x)
  bn = (f32[1,32,16], f32[32], f32[32]) batch-norm-training(folded, one, zero), epsilon=1e-05, feature_index=1
  normalized = f32[1,32,16] get-tuple-element(bn), index=0
  mean = f32[32] get-tuple-element(bn), index=1
  back = f32[4,8,16] reshape(normalized)
  grads = (f32[1,32,16], f32[32], f32[32]) batch-norm-grad(folded, one, mean, mean, normalized), epsilon=1e-05, feature_index=1
  grad = f32[1,32,16] get-tuple-element(grads), index=0
  ROOT r = (f32[4,8,16], f32[32], f32[1,32,16]) tuple(back, mean, grad)
}
"""


def test_a_layer_norm_lowered_as_a_batch_norm_of_the_folded_tokens_keeps_the_batch():
    values, entry = _batch_of_x(LAYER_NORM_AS_BATCH_NORM)
    assert values[entry["folded"]] == {(0, 1)}       # [4, 8] -> [1, 32]: merged, beside a unit dim
    assert values[entry["normalized"]] == {(0, 1)}
    assert values[entry["mean"]] == {(0, 0)}         # per feature: per token, the batch not reduced
    assert values[entry["back"]] == {(0, 0)}         # split back: the major piece
    assert values[entry["grad"]] == {(0, 1)}


# Hand-written HLO (not compiler output): an eval loss weighed per token by a float mask m, beside a
# [1, S] position row p added to the tokens' features; w is a weight.
MASKED_EVAL = """
HloModule masked_eval

ENTRY main {
  x = f32[4,8] parameter(0)
  m = f32[4,8] parameter(1)
  p = f32[1,8] parameter(2)
  w = f32[8,8] parameter(3)
  pr = f32[8] reshape(p)
  pb = f32[4,8] broadcast(pr), dimensions={1}
  xp = f32[4,8] add(x, pb)
  y = f32[4,8] dot(xp, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  weighed = f32[4,8] multiply(y, m)
  zero = f32[] constant(0)
  ROOT loss = f32[] reduce(weighed, zero), dimensions={0,1}, to_apply=add
}

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def test_an_input_that_meets_the_batch_on_its_own_dim_0_is_data():
    from hlo_doctor.semantics.batch_dims import meets_batch

    module = parse_module(MASKED_EVAL)
    graph = build_graph(module)
    # the mask meets the batch (through the dot) on dim 0; p's one row and w's rows never do
    assert meets_batch(module, graph, frozenset({0}), frozenset({1, 2, 3})) == {1}


# Hand-written HLO (not compiler output), in the form of the partitioner's reshard of a batch-split
# activation to a feature split: the batch [8] cut into [4 devices, 2 rows], the devices' dim
# exchanged by an all-to-all, then the rows moved to the front and the devices' dim folded into
# the features.
RESHARD_TO_FEATURES = """
HloModule reshard_to_features

ENTRY main {
  x = f32[8,6] parameter(0)
  cut = f32[4,2,6] reshape(x)
  moved = f32[4,2,6] all-to-all(cut), dimensions={0}, replica_groups={{0,1,2,3}}
  rows = f32[2,4,6] transpose(moved), dimensions={1,0,2}
  ROOT features = f32[2,24] reshape(rows)
}
"""


def test_a_reshard_all_to_all_leaves_the_batch_with_the_rows_this_device_keeps():
    values, entry = _batch_of_x(RESHARD_TO_FEATURES)
    assert values[entry["cut"]] == {(0, 1)}        # not the larger piece: the one the all-to-all exchanges
    assert values[entry["features"]] == {(0, 0)}   # the rows stay the batch; the features are not


# The same reshard with one row per device: [2] -> [2 devices, 1 row] reads, by shapes alone, as dim
# 0 kept and a unit dim inserted (hand-written HLO, not compiler output).
RESHARD_ONE_ROW = """
HloModule reshard_one_row

ENTRY main {
  x = f32[2,6] parameter(0)
  cut = f32[2,1,6] reshape(x)
  moved = f32[2,1,6] all-to-all(cut), dimensions={0}, replica_groups={{0,1}}
  rows = f32[1,2,6] transpose(moved), dimensions={1,0,2}
  ROOT features = f32[1,12] reshape(rows)
}
"""


def test_a_reshard_all_to_all_of_one_row_per_device_keeps_the_row_as_the_batch():
    values, entry = _batch_of_x(RESHARD_ONE_ROW)
    assert values[entry["cut"]] == {(0, 1)}
    assert values[entry["features"]] == {(0, 0)}


_W_AT_X = """\
HloModule per_example_layer, num_partitions=2

ENTRY %main (w: f32[16,8], x: f32[4,8]) -> f32[16,4] {
  %w = f32[16,8]{1,0} parameter(0)
  %x = f32[4,8]{1,0} parameter(1)
  ROOT %y = f32[16,4]{1,0} dot(%w, %x), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}
"""


def test_a_batch_input_on_the_right_of_a_known_weight():
    """Hand-written: ``w @ x.T``, as a per-example layer under vmap writes it (Equinox's Linear). The
    batch input meets the dot as its rhs, which alone says nothing (torch's ``x @ W.T`` puts a weight
    there); once the step is known to update ``w``, ``x`` is the batch."""
    from hlo_doctor.semantics.batch_dims import _follow_batch

    module = parse_module(_W_AT_X)
    graph = build_graph(module)
    x = {1: module.entry.get("x")}

    def batch(weights: frozenset[int]) -> frozenset[int]:
        return _follow_batch(module, graph, x, {1: 4}, frozenset(), weights=weights, follow=False).matmul_inputs

    assert batch(frozenset()) == frozenset()
    assert batch(frozenset({0})) == frozenset({1})


def test_the_batch_goes_through_an_optimization_barrier():
    # jax.checkpoint puts an opt-barrier around what a rematerialized step recomputes: the values
    # come out as they went in, each at its own index (hand-written HLO, the shape of the barrier in a
    # JAX train step, whose activations come after the weights)
    values, entry = _batch_of_x("""
HloModule barrier

ENTRY main {
  x = f32[8,4,6] parameter(0)
  w = f32[24,5] parameter(1)
  flat = f32[8,24] reshape(x)
  kept = (f32[24,5], f32[8,24]) tuple(w, flat)
  barrier = (f32[24,5], f32[8,24]) opt-barrier(kept)
  weight = f32[24,5] get-tuple-element(barrier), index=0
  back = f32[8,24] get-tuple-element(barrier), index=1
  ROOT y = f32[8,5] dot(back, weight), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
""")
    assert values[entry["back"]] == frozenset({(0, 0)})
    assert values[entry["weight"]] == frozenset()
    assert values[entry["y"]] == frozenset({(0, 0)})


def test_the_batch_of_a_dynamic_update_slice_is_where_its_update_lands():
    # a scan's stacked residuals: each step writes its [1, B * S, K] into an [L, B * S, K] buffer
    # (hand-written HLO, the shape of the stack in a JAX scan's forward body)
    values, entry = _batch_of_x("""
HloModule stacked

ENTRY main {
  x = f32[8,4,6] parameter(0)
  stack = f32[3,32,6] parameter(1)
  i = s32[] parameter(2)
  zero = s32[] constant(0)
  rows = f32[32,6] reshape(x)
  one = f32[1,32,6] reshape(rows)
  ROOT kept = f32[3,32,6] dynamic-update-slice(stack, one, i, zero, zero)
}
""")
    assert values[entry["one"]] == frozenset({(0, 1)})
    assert values[entry["kept"]] == frozenset({(0, 1)})
