"""Small helpers shared by the kernel modules (no Triton needed to import)."""

from __future__ import annotations

# The text model's levers (training.kernels.text applies them; norms reads rms_norm): off = the older path.
TEXT_LEVERS = {
    "rms_norm": True,
    "lora": True,
    "deepstack": True,
    "shared_input": True,
    "add_norm": True,
    "qk_norm_rope": True,
    "input_norm_residual": True,
    "liger_mlp_shared_input": True,
    "cross_layer_norm": True,
}
SESSION21_LEVERS = ("qk_norm_rope", "input_norm_residual", "liger_mlp_shared_input", "cross_layer_norm")


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


_SM: dict = {}


def _sm_count(device) -> int:
    import torch

    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SM:
        _SM[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SM[i]


def _rows(t, n: int):
    """`t` as contiguous rows [M, n] (a view when its last dim is already dense)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _rms_blocks(n: int) -> tuple[int, int, int]:
    """(block_n, block_m, warps) of the row-block kernels at row width n."""
    block_n = next_power_of_2(n)
    block_m = max(1, min(64, 8192 // block_n))
    return block_n, block_m, 8 if block_n * block_m >= 8192 else 4


def _no_grad_needed(x, weight) -> bool:
    import torch

    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
