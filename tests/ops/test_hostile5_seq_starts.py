"""Issue #36 item 5, the MLA gather's CPU path: a seq_starts entry of a request that owns no row
is never read (as the kernel, which reports nothing for it in debug mode): a negative one is
accepted and the bytes are those of any other value."""
import torch

import nvrtc_gather as ng


def test_mla_gather_seq_starts_of_an_empty_request_is_not_read():
    torch.manual_seed(0)
    src = torch.randint(0, 120, (2, 16, 656), dtype=torch.uint8)
    bt = torch.tensor([[0], [1], [1]], dtype=torch.int32)
    ws = torch.tensor([0, 4, 4], dtype=torch.int32)  # request 1 owns no row
    outs = []
    for s1 in (0, -5):
        dst = torch.zeros(8, 576, dtype=torch.bfloat16)
        ng.cp_gather_and_upconvert_fp8_kv_cache(src, dst, bt, ws, 3, torch.tensor([1, s1, 2], dtype=torch.int32))
        outs.append(dst)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
