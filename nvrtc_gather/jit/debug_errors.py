"""Debug mode (NVRTC_GATHER_DEBUG=1): kernels record the first bad index they meet in a
small device buffer, and the op raises ValueError describing it. This costs a device
sync per call, so it is for debugging, not serving. runtime.LoadedModule.launcher passes the
buffer and calls raise_if_set.

ERRORS is the host's side of the NG_ERR_* codes of cuda_src/common.cuh, by name;
tests/jit/test_spec.py checks that the two tables hold the same names and codes."""
from __future__ import annotations

import torch

ERRORS = {  # name -> (code, message with the kernel's details a, b, c)
    "NG_ERR_ROW_UNOWNED": (1, "cu_seq_lens: row {a} lies below cu_seq_lens[-1] but belongs to no request "
                              "(near request {b})"),
    "NG_ERR_BLOCK_INDEX": (2, "block_table: row {a} (request {b}) needs block_table column {c}, past its "
                              "max_blocks columns"),
    "NG_ERR_BLOCK_ID": (3, "block_table: row {a} (request {b}) maps to physical block {c}, outside [0, num_blocks)"),
    "NG_ERR_CU_START": (4, "cu_seq_lens: cu_seq_lens[0] must be 0, got {a}"),
    "NG_ERR_CU_DECREASING": (5, "cu_seq_lens: must be non-decreasing, but entry {a} = {b} > entry {a}+1 = {c}"),
    "NG_ERR_CU_TOTAL": (6, "cu_seq_lens: cu_seq_lens[-1] = {a} exceeds the {b} rows of the destination"),
    "NG_ERR_SLOT": (7, "slot_mapping: entry {a} = {b} is past the cache's last slot ({c} slots)"),
    "NG_ERR_WS_ORDER": (8, "workspace_starts: entry {a} = {b} is negative or below the entry before it ({c}); "
                           "starts must be non-negative and non-decreasing"),
    "NG_ERR_SEQ_START": (9, "seq_starts: entry {a} = {b} is negative"),
    "NG_ERR_CU_NEGATIVE": (10, "cu_seq_lens: entry {a} = {b} is negative"),
    # the index-K read (SGLang's names: seq_len_tensor, seq_len_sum, page_indices)
    "NG_ERR_LENGTH": (11, "seq_len_tensor: entry {a} = {b} is negative or past int32"),
    "NG_ERR_LENGTH_SUM": (12, "seq_len_sum: the lengths sum to {a}, more than seq_len_sum = {b} rows"),
    "NG_ERR_PAGE_INDEX": (13, "page_indices: row {a} (request {b}) needs page column {c}, past page_indices' columns"),
    "NG_ERR_TOKEN_ID": (15, "page_table_1_flattened: row {a} has token id {b}, outside [0, num_pages * page_size = {c})"),
    "NG_ERR_GATHER_LEN": (16, "gather_lens: request {a} gathers {b} tokens, more than its seq_lens entry {c}"),
    "NG_ERR_OUT_ROWS": (17, "out: request {a} needs row {b}, past out's {c} rows (offset + gather length)"),
    "NG_ERR_PAGE_ID": (14, "page_indices: row {a} (request {b}) maps to page {c}, outside [0, num_pages)"),
}
_MESSAGES = {code: message for code, message in ERRORS.values()}


def raise_if_set(err: torch.Tensor, op: str) -> None:
    code, a, b, c = (int(x) for x in err.cpu())
    if code:
        msg = _MESSAGES.get(code, "unknown error code {code}").format(code=code, a=a, b=b, c=c)
        raise ValueError(f"{op} (debug mode): {msg}; rows with bad indices were skipped")
