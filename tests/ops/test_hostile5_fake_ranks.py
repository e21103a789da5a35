"""Round five (issue #37 item 2): under torch.compile the ops' fakes check ranks (and types)
before they read shapes, with eager's messages: a 0-d ``cu_seq_lens`` gave the fake's
``IndexError: tuple index out of range`` where eager raises the ValueError naming it. Each
tensor argument in turn becomes 0-d (or 3-d); eager and compiled calls must agree."""
import pytest
import torch

from helpers import op_calls

CASES = [(op, i, arg) for op in op_calls.calls() for i, arg in op_calls.tensor_names(op)]
SHAPES = {"0-d": lambda t: t.reshape(-1)[:1].reshape(()), "3-d": lambda t: t.reshape(1, 1, -1) if t.dim() != 3
          else t.reshape(1, -1)}


def _outcome(fn, args):
    try:
        fn(*args)
        return None
    except (TypeError, ValueError, RuntimeError) as exc:  # dynamo wraps the fake's error
        return exc


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op,index,arg", CASES, ids=[f"{o}-{a}" for o, _, a in CASES])
def test_a_wrong_rank_under_compile_gives_eagers_error(op, index, arg, shape):
    args = list(op_calls.calls()[op]())
    if index >= len(args):
        pytest.skip("an optional argument the call leaves out")
    args[index] = SHAPES[shape](args[index]).clone()
    eager = _outcome(op_calls.plain(op), args)
    torch._dynamo.reset()
    compiled = _outcome(torch.compile(op_calls.plain(op), fullgraph=True, backend="eager"), args)
    if eager is None:
        assert compiled is None, compiled
    else:
        assert isinstance(eager, (TypeError, ValueError)), eager
        assert compiled is not None and str(eager) in str(compiled), (str(eager), str(compiled)[:1500])
