"""Loss functions on hand-built tensors and on a real tiny Qwen3-VL: the labelled-only head equals the full one."""

import torch

from training.losses import chunked_head_loss, labelled_token_loss, token_loss_sum


def test_token_loss_sum_by_hand():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0  # position 0 predicts token 2 confidently
    labels = torch.tensor([[-100, 2, -100]])
    loss, n = token_loss_sum(logits, labels)
    expected = -torch.log_softmax(torch.tensor([0.0, 0.0, 10.0, 0.0]), 0)[2]
    assert n == 1 and torch.allclose(loss, expected)


def test_chunked_head_equals_unchunked():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    h, t = torch.randn(10, 8), torch.randint(0, 11, (10,))
    full = torch.nn.functional.cross_entropy(head(h), t, reduction="sum")
    assert torch.allclose(chunked_head_loss(h, head, t, chunk=3), full, atol=1e-5)


def test_labelled_loss_matches_full_logits_on_tiny_qwen3vl_with_lora():
    from training.models import apply_lora, build_model
    model, proc = build_model("qwen3-vl", "tiny", seed=0)
    model = apply_lora(model, r=4, alpha=8, dropout=0.0)
    torch.manual_seed(0)
    ids = torch.randint(10, 200, (2, 24))
    labels = torch.full_like(ids, -100)
    labels[:, 15:20] = ids[:, 15:20]  # a few "assistant" tokens per row
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ref, n_ref = token_loss_sum(model(**batch).logits, labels)
    got, n = labelled_token_loss(model, batch, labels)
    assert n == n_ref == 10 and torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    got.backward()  # gradients reach the LoRA adapters through the backbone
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n_, p in model.named_parameters() if "lora_" in n_)
