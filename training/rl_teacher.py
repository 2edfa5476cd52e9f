"""rl.sdpo_teacher_check: does the SDPO teacher (the trainer's weights plus the privileged block) read that block?
A mixin of training.rl.RLTrainer; it uses the trainer's encoder, models and `_score`.

    stats = trainer.teacher_stats(rows, tenc, old, resp)   # own_gap, read_gain (benchmarks/sdpo_teacher.py prints them)
"""

from __future__ import annotations

from typing import Any

from training.rl_encode import teacher_messages
from training.rl_settings import SDPOTeacherError


class TeacherCheck:
    """The SDPO teacher's encodings and the two tests of rl.sdpo_teacher_check (RLTrainer's mixin)."""

    def teacher_stats(self, rows, tenc, old, resp) -> dict[str, Any]:
        """The two tests of rl.sdpo_teacher_check on up to 64 rows each, for the teacher (these weights plus the
        privileged block; `tenc` its encodings, `old` the student's log-probs of `resp`, the replies):
        - own_gap (does it mislead?): on successful rows with a sibling's solution, the mean log pT - log pS over the
          student's own right tokens (own_higher: the share of tokens where the teacher is higher). A mini student
          SFT-trained without sft.hint_fraction and shown whole sibling episodes scored -0.54, and SDPO took it
          from 75.8% to 0% (docs/LOG.md, session 47);
        - read_gain (does it read? rl.sdpo_hint screen): on failed rows whose sibling acted otherwise on the same
          screen, the mean change the block makes to log p(the sibling's reply), in nats (-1.34 without hint-aware
          SFT, +4.81 with it).
        None where no row qualifies. The update's summary carries them (rl_round.json)."""
        import torch

        own = [i for i in tenc if rows[i].get("success") and rows[i].get("sdpo_solution")][:64]
        gaps = [t - old[i] for t, i in zip(self._score(self.teacher, [tenc[i] for i in own]), own)]
        at = {(r["episode_id"], r["step_idx"]): j for j, r in enumerate(rows)}
        pairs = []  # (failed row, its sibling's row on the same screen) where the two replies differ
        for i in tenc:
            j = at.get((rows[i].get("sdpo_sibling_episode_id"), rows[i].get("sdpo_sibling_step")))
            if not rows[i].get("success") and j is not None and resp[j] != resp[i] and len(pairs) < 64:
                pairs.append((i, j))
        gap = torch.cat(gaps) if gaps else torch.zeros(0)
        return dict(
            own_rows=len(own),
            own_gap=float(gap.mean()) if gap.numel() else None,
            own_higher=float((gap > 0).float().mean()) if gap.numel() else None,
            read_rows=len(pairs),
            read_gain=self._read_gain(rows, resp, pairs) if pairs else None,
        )

    def _check_teacher(self, st: dict[str, Any]) -> None:
        """rl.sdpo_teacher_check on teacher_stats: SDPOTeacherError naming each failed test."""
        why = []
        if st["own_gap"] is not None and st["own_gap"] < self.s.sdpo_teacher_check:
            why.append(
                f"on {st['own_rows']} successful rows its mean log pT - log pS over the student's own tokens is"
                f" {st['own_gap']:+.3f}, under the floor rl.sdpo_teacher_check = {self.s.sdpo_teacher_check}"
            )
        if st["read_gain"] is not None and st["read_gain"] <= 0:
            why.append(
                f"on {st['read_rows']} failed rows whose successful sibling acted otherwise on the same screen, the"
                f" block changes log p(the sibling's reply) by {st['read_gain']:+.2f} nats on average (it must raise"
                " it)"
            )
        if why:
            raise SDPOTeacherError(
                f"the SDPO teacher does not read its privileged block: {'; '.join(why)}, so distilling toward it would"
                " pull the student off its right replies. Train the checkpoint with sft.hint_fraction > 0 (hint-aware"
                " SFT), use a model that reads context, or set rl.sdpo_teacher_check: null to run anyway"
            )

    def teacher_encoding(self, row: dict[str, Any], ids) -> dict[str, Any]:
        """The SDPO teacher's encoding of reply `ids` after `row`'s prompt with its privileged block."""
        block = teacher_messages(row["messages"], row.get("sdpo_solution"), row.get("sdpo_feedback"))
        return self.encoder.encode(block, row["images"], ids)

    def _read_gain(self, rows, resp, pairs) -> float:
        """Mean over (row i, sibling row j) of log pT - log pS of j's reply after i's prompt (pT: with i's block)."""
        student, teacher = [], []
        for i, j in pairs:
            student.append(self.encoder.encode(rows[i]["messages"], rows[i]["images"], resp[j]))
            teacher.append(self.teacher_encoding(rows[i], resp[j]))
        gains = [
            float(t.sum() - q.sum())
            for t, q in zip(self._score(self.teacher, teacher), self._score(self.model, student))
        ]
        return sum(gains) / len(gains)
