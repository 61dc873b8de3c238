"""The custom-loss graph validator and cost model under fuzzing (no server: they are what `create_custom_loss` runs).

Random graphs are drawn from the whitelisted ops (`custom_loss_ops`), with arguments that are right, wrong in type
(dicts where names go, lists, unicode, huge and negative integers), references to later or unknown nodes, repeated
names, misplaced placeholders and outputs, and malformed inputs. Every draw must either validate or raise the
validator's own `GraphError` (a 422 naming the node), never any other exception (a 500, as issue 46's
``getattr(logprobs, logprobs)`` was); a graph that validates must price (`estimate`, as the POST does) and evaluate on
small real tensors with nothing but `GraphError` escaping. Plus the prices themselves: the nuclear norm is cubic,
sorts are n log n, elementwise ops linear, and every whitelisted op has one.

`TWINKLE_FUZZ_EXAMPLES` / `TWINKLE_FUZZ_SEED` fuzz deeper, as in test_fuzz_routes.py.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from twinkle_server.engine.custom_loss import cost, ops
from twinkle_server.engine.custom_loss.ops import GraphError
from twinkle_server.engine.custom_loss.program import CustomLossSpec

EXAMPLES = int(os.environ.get('TWINKLE_FUZZ_EXAMPLES', '150'))
SEED = int(os.environ.get('TWINKLE_FUZZ_SEED', '46'))

TARGETS = sorted(ops.FUNCTIONS) + sorted(ops.GETATTR)
METHODS = sorted(ops.METHODS)
NAMES = st.sampled_from(['lp', 'w', 'a', 'b', 'c', 'd', 'output']) | st.text(max_size=6)
HOSTILE = st.sampled_from(
    [
        2**63,
        -(2**63) - 1,
        10**30,
        -(10**7),
        1e308,
        float('nan'),
        'cuda',
        'nuc',
        'fro',
        'shape',
        '\u202e\U0001f600',
        '',
        None,
        True,
        [],
        {},
        {'ref': {'ref': 'lp'}},
        {'ref': ['lp']},
        {'ref': 'nope'},
        {'tuple': 'x'},
        {'slice': [1]},
        {'dtype': 'complex64'},
        {'device': 'cuda'},
        {'float': 'inf'},
        {'ellipsis': True},
        {'a': 1, 'b': 2},
    ]
)


def _arg(defined: list[str]) -> st.SearchStrategy:
    refs = st.sampled_from(defined).map(lambda n: {'ref': n}) if defined else st.nothing()
    leaf = st.one_of(
        refs,
        refs,
        st.integers(-3, 3),
        st.floats(allow_nan=False, width=32, min_value=-4, max_value=4),
        st.sampled_from(sorted(ops.ATTRIBUTES)),
        HOSTILE,
        st.text(max_size=4),
    )
    return st.recursive(
        leaf,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.lists(inner, max_size=3).map(lambda v: {'tuple': v})
            | st.lists(inner, min_size=3, max_size=3).map(lambda v: {'slice': v})
            | st.dictionaries(st.sampled_from(['dim', 'keepdim', 'p', 'out', 'k', 'x']), inner, max_size=2).map(
                lambda v: {'dict': v}
            )
        ),
        max_leaves=4,
    )


@st.composite
def graphs(draw) -> tuple[list, list]:
    """(inputs, nodes): mostly well-formed placeholders and output around random calls, sometimes bent."""
    inputs = [{'name': 'logprobs', 'rank': draw(st.sampled_from([1, 1, 2]))}]
    if draw(st.booleans()):
        inputs.append({'name': 'w', 'rank': draw(st.sampled_from([0, 1, 1, 2]))})
    if draw(st.integers(0, 19)) == 7:
        inputs = draw(st.sampled_from([[], [{'name': 'logprobs'}], [{'name': 1, 'rank': True}], ['x'], 'logprobs']))
    nodes: list = [{'op': 'placeholder', 'name': 'lp', 'target': 'logprobs'}]
    if any(isinstance(i, dict) and i.get('name') == 'w' for i in inputs):
        nodes.append({'op': 'placeholder', 'name': 'w', 'target': 'w'})
    defined = [n['name'] for n in nodes]
    for i in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(['call_function', 'call_method', 'call_function', 'call_method', 'get_attr']))
        known = st.sampled_from(TARGETS if kind == 'call_function' else METHODS)
        target = draw(st.one_of(known, known, known, st.text(max_size=8)))
        name = draw(st.sampled_from([f'n{i}'] * 8 + ['lp', '1x', f'n{i}\u00e9', 'logprobs']))
        node = {'op': kind, 'name': name, 'target': target, 'args': draw(st.lists(_arg(defined), max_size=3))}
        if draw(st.booleans()):
            node['kwargs'] = draw(st.dictionaries(st.sampled_from(['dim', 'p', 'keepdim', 'out']), _arg(defined)))
        if draw(st.integers(0, 19)) == 7:
            bent = [{'op': kind}, {'name': name}, [kind, name], 'node', None, {**node, 'args': {}}, {**node, 'op': 1}]
            node = draw(st.sampled_from(bent))
        nodes.append(node)
        defined.append(name)
    loss = draw(st.sampled_from(defined))
    if draw(st.booleans()):  # a scalar loss, so that more evaluations run to the end
        nodes.append({'op': 'call_method', 'name': 'total', 'target': 'sum', 'args': [{'ref': loss}]})
        loss = 'total'
    metrics = draw(
        st.sampled_from(
            [{}, {'custom/m:sum': {'ref': loss}}, {'custom/m:mean': {'ref': loss}}, {'bad key': {'ref': loss}}]
        ).map(lambda m: {'dict': m})
        | HOSTILE
    )
    output = {'op': 'output', 'name': 'output', 'target': 'output', 'args': [{'tuple': [{'ref': loss}, metrics]}]}
    if draw(st.integers(0, 19)) == 7:
        output = {**output, 'args': draw(st.lists(_arg(defined), max_size=2))}
    nodes.append(output)
    if draw(st.integers(0, 19)) == 7:
        nodes = draw(st.sampled_from([{}, 'nodes', [None], nodes[::-1], nodes + nodes]))
    return inputs, nodes


def _values(inputs: list, n: int = 5, k: int = 3) -> list[torch.Tensor]:
    shapes = {0: (), 1: (n,), 2: (n, k)}
    return [-torch.rand(shapes[i['rank']]) for i in inputs]


@pytest.mark.timeout(60)
@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(graphs())
def test_any_graph_validates_or_is_a_graph_error(graph):
    inputs, nodes = graph
    try:
        spec = CustomLossSpec.validate('fuzz', inputs, nodes)
    except GraphError as exc:
        assert str(exc)  # a message the 422 carries
        return
    estimate = spec.estimate(64, 4)  # what the POST prices: never raises
    assert estimate.total >= 0
    try:
        estimate.check(cost.CostLimits(flops=1e6, context=64, time_s=1.0), 'tiny')
    except GraphError:
        pass
    try:
        spec.program.run(_values(inputs), 'datum 0', cost.Budget(1e8, 5.0))
    except GraphError:
        pass


def test_the_getattr_graph_of_issue_46_is_a_graph_error_naming_the_node():
    nodes = [
        {'op': 'placeholder', 'name': 'logprobs', 'target': 'logprobs'},
        {'op': 'call_function', 'name': 'g', 'target': 'builtins.getattr', 'args': [{'ref': 'logprobs'}] * 2},
        {'op': 'output', 'name': 'output', 'target': 'output', 'args': [{'tuple': [{'ref': 'g'}, {'dict': {}}]}]},
    ]
    with pytest.raises(GraphError, match=r"node 1 \('g'\): getattr takes \(tensor, attribute name\)"):
        CustomLossSpec.validate('x', [{'name': 'logprobs', 'rank': 1}], nodes)


# ---- prices ---------------------------------------------------------------------------------------------------------
def _price(target: str, *args, **kwargs) -> int:
    return cost.node_cost(target, list(args), kwargs) - cost.NODE_OVERHEAD


def test_prices_follow_the_real_complexity_of_each_op():
    def m(*shape):
        return torch.empty(shape, device='meta')

    assert _price('torch.exp', m(1000)) == 1000  # elementwise: linear
    assert _price('operator.mul', m(64, 1), m(1, 32)) == 64 * 32  # an outer product: its output
    assert _price('torch.sum', m(100, 10)) == 1000  # reductions: their input
    assert _price('torch.cumsum', m(4096), dim=0) == 4096
    assert _price('sort', m(1024)) == 1024 * 10  # n log n
    assert _price('torch.topk', m(8, 256), 3) == 8 * 256 * 8
    nuc = _price('torch.functional.norm', m(300, 200), 'nuc')  # an SVD: min^2 max
    assert nuc == cost.DECOMPOSITION_FACTOR * 200**2 * 300
    assert _price('norm', m(2, 30, 20), p='nuc') == cost.DECOMPOSITION_FACTOR * 2 * 20**2 * 30
    assert _price('torch.functional.norm', m(300, 200), 'fro') == cost.MULTI_PASS * 300 * 200  # a vector norm
    assert _price('torch.linalg.svd', m(50, 40)) == cost.DECOMPOSITION_FACTOR * 40**2 * 50
    assert _price('torch.matmul', m(30, 40), m(40, 50)) == 30 * 40 * 50
    assert _price('reshape', m(1000), 10, 100) == 0  # views are free (but for the dispatch)
    for name in (*ops.FUNCTIONS, *ops.METHODS):  # every whitelisted op is priced, at least its dispatch
        assert cost.node_cost(name, [m(4, 4)], {}) >= cost.NODE_OVERHEAD


def test_the_issue_46_nuclear_norm_graph_is_priced_cubic_at_the_full_context():
    nodes = [
        {'op': 'placeholder', 'name': 'logprobs', 'target': 'logprobs'},
        {'op': 'call_method', 'name': 'a', 'target': 'unsqueeze', 'args': [{'ref': 'logprobs'}, 1]},
        {'op': 'call_method', 'name': 'b', 'target': 'unsqueeze', 'args': [{'ref': 'logprobs'}, 0]},
        {'op': 'call_function', 'name': 'o', 'target': 'operator.mul', 'args': [{'ref': 'a'}, {'ref': 'b'}]},
        {'op': 'call_function', 'name': 'n0', 'target': 'torch.functional.norm', 'args': [{'ref': 'o'}, 'nuc']},
        {'op': 'output', 'name': 'output', 'target': 'output', 'args': [{'tuple': [{'ref': 'n0'}, {'dict': {}}]}]},
    ]
    spec = CustomLossSpec.validate('nuc', [{'name': 'logprobs', 'rank': 1}], nodes)
    small, large = spec.estimate(1024, 1), spec.estimate(4096, 1)  # past MAX_ELEMENTS at 4096: priced anyway
    assert small.costliest()[0] == large.costliest()[0] == 'n0'
    work = [e.per_node['n0'] - cost.NODE_OVERHEAD for e in (small, large)]
    assert work[1] == 64 * work[0]  # 4x the length, 64x the work
    with pytest.raises(GraphError, match=r"node 'n0' is estimated at 550 G FLOPs .* budget of 1 G FLOPs"):
        large.check(cost.CostLimits(flops=1e9, context=4096, time_s=1.0), 'm')
